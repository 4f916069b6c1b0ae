"""Adasum's combination, computed apart from Horovod, for the scripts that check it."""
import numpy as np


def adasum(a, b):
    """Adasum of two ranks' tensors (Maleki et al.), as Horovod computes it per tensor."""
    dot = float(np.vdot(a, b))
    return (1 - dot / (2 * float(np.vdot(a, a)))) * a + (1 - dot / (2 * float(np.vdot(b, b)))) * b
