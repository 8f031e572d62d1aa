"""Real Flower deployments: a SuperLink and SuperNodes over gRPC, managed by process id.

Secure by default (TLS, SuperNode authentication); optionally each SuperNode in its own
network namespace behind a rate-limited link (:mod:`fedsync.deploy.netns`).
"""

from fedsync.deploy.auth import NodeKey, RegistrationError, generate_node_key
from fedsync.deploy.local import (
    DeploymentError,
    InsecureDeploymentWarning,
    LocalDeployment,
    LocalSuperLink,
    RunOutcome,
)
from fedsync.deploy.netns import LinkShape, NetnsUnavailable, ShapedNetwork
from fedsync.deploy.tls import TlsFiles, generate_certificates

__all__ = [
    "DeploymentError",
    "InsecureDeploymentWarning",
    "LinkShape",
    "LocalDeployment",
    "LocalSuperLink",
    "NetnsUnavailable",
    "NodeKey",
    "RegistrationError",
    "RunOutcome",
    "ShapedNetwork",
    "TlsFiles",
    "generate_certificates",
    "generate_node_key",
]
