"""Transactions (KIP-98, KIP-447): the transaction coordinator, on the shared timer.

Each broker coordinates the transactional ids of the ``__transaction_state`` partitions it
leads (the same ownership, load and acks=all writes as the group coordinator's:
broker/replication/coordinator_log.py). The partition side (control batches, the LSO,
read_committed) is in replication/storage; the group coordinator holds transactional
offsets until their marker.

=========================================  ==========================================
here                                       Kafka (core/.../coordinator/transaction)
=========================================  ==========================================
``TransactionMetadata``, ``TxnState``      TransactionMetadata, TransactionState
(metadata.py)
``TransactionStateManager`` (manager.py)   TransactionStateManager: ownership, loading,
                                           appendTransactionToLog
``TransactionCoordinator`` (coordinator)   TransactionCoordinator: handleInitProducerId,
                                           handleAddPartitionsToTransaction,
                                           handleEndTransaction, abortTimedOutTransactions
``TxnTimeout`` (delayed.py)               (ours) a timer task per open transaction
``TransactionMarkerChannelManager``        TransactionMarkerChannelManager and its
(markers.py)                               completion handler
``TransactionService`` (service.py)        what KafkaApis calls, FindCoordinator key 1,
                                           removeExpiredTransactionalIds
=========================================  ==========================================
"""

from minibroker.broker.transaction.coordinator import TransactionCoordinator
from minibroker.broker.transaction.manager import TransactionStateManager
from minibroker.broker.transaction.markers import TransactionMarkerChannelManager
from minibroker.broker.transaction.metadata import TransactionMetadata, TxnState
from minibroker.broker.transaction.records import TXN_TOPIC
from minibroker.broker.transaction.service import TransactionService

__all__ = [
    "TXN_TOPIC",
    "TransactionCoordinator",
    "TransactionMarkerChannelManager",
    "TransactionMetadata",
    "TransactionService",
    "TransactionStateManager",
    "TxnState",
]
