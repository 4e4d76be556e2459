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


def test_recording_raises_on_values_and_leaves_the_tape_intact():
    lst = ad.WengertList()
    x = lst.variable(1.0)
    y = x * 2.0
    with ad.detect_anomaly():
        with pytest.raises(ad.AnomalyError, match="mul produced a value of inf in reverse"):
            x * float("inf")
        assert len(lst) == 2        # the failed product took no entry
        assert y.derivatives()[x] == 2.0


def test_an_infinite_partial_nothing_flows_through_is_no_anomaly():
    # issue 12, item 9: sqrt'(0) is inf, but the gradient of sqrt(x - x) * 0 + x is 1
    lst = ad.WengertList()
    x = lst.variable(2.0)
    with ad.detect_anomaly():
        y = ad.sqrt(x - x) * 0 + x
        assert y.derivatives()[x] == 1.0
        F = ad.record(lambda v: ad.sqrt(v[0] - v[0]) * 0 + v[0], [2.0])
        np.testing.assert_array_equal(F.gradient(np.array([[3.0], [-1.0]])), [[1.0], [1.0]])
        with pytest.raises(ad.AnomalyError, match=r"adjoint of inf for entry 5, through "
                                                  r"sqrt \(entry 6\) recorded at .*test_anomaly"):
            ad.sqrt(x - 2.0).derivatives()


def test_tensor_gradients_are_checked():
    # issue 12, item 9: the tensor gradient [inf, 0.5] of sum(sqrt(t)) at t = [0, 1]
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.array([0.0, 1.0]), lst, device="numpy")
    np.testing.assert_array_equal(ad.sum(ad.sqrt(t)).derivatives()[t], [np.inf, 0.5])
    with ad.detect_anomaly():
        y = ad.sum(ad.sqrt(t))
        with pytest.raises(ad.AnomalyError, match=r"adjoint of inf for input 0 of sqrt "
                                                  r"\(entry \d+\) recorded at .*test_anomaly"):
            y.derivatives()
        np.testing.assert_array_equal(ad.sum(t * 2.0).derivatives()[t], [2.0, 2.0])


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
        with pytest.raises(ad.AnomalyError, match="adjoint of inf.*through sqrt"):
            F.gradient(X)
