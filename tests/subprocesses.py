"""A real subprocess under test that can be SIGKILLed on demand or stopped gracefully."""

import signal
import subprocess


class ManagedProcess:
    """Subclasses start ``self.proc``; ``stop`` sends SIGTERM and falls back to SIGKILL after ``stop_timeout``."""

    proc = None
    stop_timeout = 10.0

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
