"""StopRequest: the first SIGINT/SIGTERM is recorded (the run stops after its rollout), the second stops at once."""

import os
import signal

import pytest

from miles.utils.errors import RunInterrupted
from miles.utils.stop_signals import StopRequest


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_first_signal_is_recorded_and_the_second_stops_at_once(capsys, signum, status):
    previous = signal.getsignal(signum)
    with StopRequest(lambda: "The latest checkpoint is rollout 4.").handled() as stop:
        os.kill(os.getpid(), signum)  # handled before os.kill returns: Python runs it at the next bytecode
        assert stop.signum == signum and stop.name == signal.Signals(signum).name
        assert "stopping after the rollout in progress" in capsys.readouterr().err
        with pytest.raises(RunInterrupted) as caught:
            os.kill(os.getpid(), signum)
    assert caught.value.exit_status == status
    assert str(caught.value) == (f"{stop.name} received after {stop.name}: stopped at once; the rollout in progress "
                                 "is not saved. The latest checkpoint is rollout 4.")
    assert signal.getsignal(signum) is previous  # restored after the run


def test_no_signal_leaves_the_request_empty():
    with StopRequest().handled() as stop:
        pass
    assert stop.signum is None
