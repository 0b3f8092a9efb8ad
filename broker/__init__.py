"""The broker: trio server, partition logs, replication, controller role and the purgatory."""

from .config import BrokerConfig, ConfigError, load_config
from .server import Broker, run_broker

__all__ = ["Broker", "BrokerConfig", "ConfigError", "load_config", "run_broker"]
