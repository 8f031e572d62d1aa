"""What a run leaves behind: an event log (JSON lines), ``summary.json`` and plots."""

from fedsync.reports.event_log import EventLog, read_events
from fedsync.reports.plots import plot_accuracy, plot_run
from fedsync.reports.recorder import RunRecorder
from fedsync.reports.summary import RunFailedError, RunSummary

__all__ = [
    "EventLog",
    "RunFailedError",
    "RunRecorder",
    "RunSummary",
    "plot_accuracy",
    "plot_run",
    "read_events",
]
