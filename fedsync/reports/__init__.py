"""What a run leaves behind: an event log (JSON lines), ``summary.json`` and plots."""

from fedsync.reports.event_log import EventLog, read_events
from fedsync.reports.plots import plot_accuracy, plot_run
from fedsync.reports.recorder import RunRecorder

__all__ = ["EventLog", "RunRecorder", "plot_accuracy", "plot_run", "read_events"]
