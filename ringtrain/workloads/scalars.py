"""`--log-dir`: TensorBoard scalars (train/loss, train/learning_rate,
test/accuracy, test/loss), written by the chief of every mode.

Written with TensorBoard's own event-file writer, which needs no TF session
or eager context: the same code serves the eager modes and the graph-mode PS.
"""
import time


class Scalars:
    def __init__(self, log_dir):
        self._writer = None
        if log_dir:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
            self._writer = EventFileWriter(log_dir)  # (the folder was checked at start-up)

    def write(self, step, values):
        """values: {tag: number}; None values are left out."""
        if not self._writer:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        tags = [Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items() if v is not None]
        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=Summary(value=tags)))

    def close(self):
        if self._writer:
            self._writer.close()
            self._writer = None
