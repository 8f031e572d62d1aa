"""Asynchronous aggregation: staleness weights, the K-update buffer, server optimizers,
policies (TEASQ-Fed, FedBuff, FedAsync), the work scheduler and the compression schedule.

Everything here works on :class:`~fedsync.updates.SparseTensor` updates and plain
tensors; nothing imports Flower or knows which clock drives it.
"""

from fedsync.aggregation.buffer import (
    BufferedAggregate,
    BufferFull,
    BufferNotReady,
    UpdateBuffer,
)
from fedsync.aggregation.policies import (
    POLICIES,
    AsyncPolicy,
    build_policy,
    fedasync,
    fedbuff,
    teasq,
)
from fedsync.aggregation.schedule import DEFAULT_UPLINK_TEMPLATE, CompressionSchedule
from fedsync.aggregation.scheduler import DeviceState, SchedulerError, TaskScheduler
from fedsync.aggregation.server_optimizer import (
    SERVER_OPTIMIZERS,
    ServerAdam,
    ServerMomentum,
    ServerOptimizer,
    ServerSGD,
    build_server_optimizer,
)
from fedsync.aggregation.staleness import (
    STALENESS_FUNCTIONS,
    Constant,
    Hinge,
    NormalizedPolynomial,
    Polynomial,
    StalenessFunction,
    parse_staleness,
)
from fedsync.aggregation.validation import InvalidUpdate, validate_update

__all__ = [
    "DEFAULT_UPLINK_TEMPLATE",
    "POLICIES",
    "SERVER_OPTIMIZERS",
    "STALENESS_FUNCTIONS",
    "AsyncPolicy",
    "BufferFull",
    "BufferNotReady",
    "BufferedAggregate",
    "CompressionSchedule",
    "Constant",
    "DeviceState",
    "Hinge",
    "InvalidUpdate",
    "NormalizedPolynomial",
    "Polynomial",
    "SchedulerError",
    "ServerAdam",
    "ServerMomentum",
    "ServerOptimizer",
    "ServerSGD",
    "StalenessFunction",
    "TaskScheduler",
    "UpdateBuffer",
    "build_policy",
    "build_server_optimizer",
    "fedasync",
    "fedbuff",
    "parse_staleness",
    "teasq",
    "validate_update",
]
