"""The one compiled piece: the record walk's hot loop (protocol/kafka/_record_walk.c).

Optional: without a C compiler the build goes on and protocol/kafka/record_stream.py
uses its Python loop (the same checks, several times slower). Everything else is in
pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "minibroker.protocol.kafka._record_walk",
            ["protocol/kafka/_record_walk.c"],
            optional=True,
        )
    ]
)
