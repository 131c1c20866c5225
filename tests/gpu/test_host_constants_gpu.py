"""cupy.asarray / cupy.array of host data inside a capture: staged as a constant of the graph
(pinned memory the graph keeps), a NumPy array with a warning that it is read once, a pinned
array read at every replay."""

from __future__ import annotations

import cupy
import cupyx
import numpy as np
import pytest

from cugraphrt import Graph, graph

pytestmark = pytest.mark.gpu


def test_host_values_in_a_capture_are_constants_of_the_graph():
    x = cupy.arange(3, dtype=cupy.float32)
    g = Graph()
    with graph(g):
        y = x * cupy.asarray([1.0, 2.0, 3.0], dtype=cupy.float32) + cupy.array(0.5,
                                                                                 cupy.float32)
    for values in ([1.0, 1.0, 1.0], [2.0, -1.0, 0.0]):
        x[...] = cupy.asarray(values, dtype=cupy.float32)  # eager: CuPy's own path
        g.replay()
        np.testing.assert_array_equal(y.get(), np.array(values, np.float32) * [1, 2, 3] + 0.5)


def test_a_numpy_array_is_read_once_with_a_warning_and_a_pinned_one_at_every_replay():
    x = cupy.ones(2, dtype=cupy.float32)
    table = np.array([2.0, 4.0], dtype=np.float32)
    g = Graph()
    with pytest.warns(UserWarning, match=r"NumPy array \(float32, shape \(2,\)\)"), graph(g):
        y = x * cupy.asarray(table)
    table[:] = 0  # the graph keeps what the capture read
    g.replay()
    np.testing.assert_array_equal(y.get(), [2.0, 4.0])
    pinned = cupyx.empty_pinned(2, dtype=np.float32)
    pinned[:] = [1.0, 1.0]
    g2 = Graph()
    with graph(g2):
        z = x * cupy.asarray(pinned)
    pinned[:] = [3.0, 5.0]
    g2.replay()
    np.testing.assert_array_equal(z.get(), [3.0, 5.0])
