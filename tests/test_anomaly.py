"""ad.detect_anomaly(): the first NaN/inf value or derivative raises, naming the operation
and the user's line, in forward mode, reverse mode (recording and backward) and replay."""
import numpy as np
import pytest

import easyad as ad


def test_off_by_default_and_nan_flows_as_on_floats():
    lst = ad.WengertList()
    x = lst.variable(0.0)
    assert ad.sqrt(x).derivatives()[x] == float("inf")
    assert ad.sqrt(ad.Trace.variable(0.0)).derivative == float("inf")


def test_forward_mode_names_operation_and_line():
    with ad.detect_anomaly():
        t = ad.Trace.variable(0.0)
        with pytest.raises(ad.AnomalyError, match=r"sqrt produced a derivative of inf in "
                                                  r"forward mode \(Trace\), at "
                                                  r".*test_anomaly.py:\d+"):
            ad.sqrt(t)
        assert ad.sin(t).derivative == 1.0  # finite operations pass
    assert ad.sqrt(ad.Trace.variable(0.0)).derivative == float("inf")  # off again


def test_recording_raises_and_leaves_the_tape_intact():
    lst = ad.WengertList()
    x = lst.variable(0.0)
    y = x * 2.0
    with ad.detect_anomaly():
        with pytest.raises(ad.AnomalyError, match="sqrt produced a derivative of inf"):
            ad.sqrt(x)
        assert len(lst) == 2
        assert y.derivatives()[x] == 2.0


def test_backward_sweep_names_the_operation_it_flowed_through():
    lst = ad.WengertList()
    x = lst.variable(1e-320)        # subnormal: 1/x overflows to inf in the partial of log
    y = lst.variable(2.0)
    with ad.detect_anomaly():
        z = y * x                    # recorded with finite partials
    z2 = ad.log(z)                   # recorded outside the block: its partial 1/z is inf
    with ad.detect_anomaly():
        with pytest.raises(ad.AnomalyError,
                           match=r"backward sweep produced an adjoint of inf.*log"):
            z2.derivatives()


def test_replay_reports_the_row_and_re_records_to_name_the_operation():
    F = ad.record(lambda v: ad.sqrt(v[0]) + v[1], [1.0, 1.0])
    X = np.array([[4.0, 1.0], [0.0, 1.0]])
    assert np.isinf(F.gradient(X)[1, 0])
    with ad.detect_anomaly():
        with pytest.raises(ad.AnomalyError, match="sqrt produced a derivative of inf"):
            F.gradient(X)
