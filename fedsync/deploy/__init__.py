"""Real Flower deployments: a SuperLink and SuperNodes over gRPC, managed by process id."""

from fedsync.deploy.local import DeploymentError, LocalDeployment, LocalSuperLink, RunOutcome

__all__ = ["DeploymentError", "LocalDeployment", "LocalSuperLink", "RunOutcome"]
