"""Asynchronous aggregation: staleness weights, the K-update buffer, server optimizers,
the work scheduler, the downlink encoder, the norm guard and the compression schedule.

Everything here works on :class:`~fedsync.updates.SparseTensor` updates and plain
tensors; nothing imports Flower or knows which clock drives it.
"""

from fedsync.aggregation.buffer import (
    BufferedAggregate,
    BufferFull,
    BufferNotReady,
    UpdateBuffer,
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
from fedsync.aggregation.update_transform import (
    UPDATE_TRANSFORMS,
    UpdateTransform,
    resolve_update_transform,
)
from fedsync.aggregation.validation import InvalidUpdate, ValidUpdate, validate_update

__all__ = [
    "DEFAULT_UPLINK_TEMPLATE",
    "SERVER_OPTIMIZERS",
    "STALENESS_FUNCTIONS",
    "UPDATE_TRANSFORMS",
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
    "UpdateTransform",
    "ValidUpdate",
    "build_server_optimizer",
    "parse_staleness",
    "resolve_update_transform",
    "validate_update",
]
