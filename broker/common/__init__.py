"""What every broker subsystem may use: configuration, topic configs, logging set-up,
the request-path histogram, the millisecond clocks and atomic file writes.

Imports nothing else of the broker's; everything else may import it."""
