"""Operations: the `minibroker` command, the cluster launcher, benchmarks, example pipelines."""
