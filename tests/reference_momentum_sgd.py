"""NumPy references for kfit's optimizers on linear regression ``y = x @ W + b`` with mean squared error.

Written from SPEC section 2 alone, in float64, with the gradient worked out by hand, so that the tests
compare Keras's float32 training on each backend with an independent implementation.
"""

import numpy as np


def mse_gradients(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """Mean gradient ``g`` of ``mean((x @ W + b - y)**2)`` with respect to ``[W, b]``.

    For one output unit the mean runs over the minibatch, as Keras's ``"mse"`` loss does.
    """
    kernel, bias = weights
    error = x @ kernel + bias - y  # (B, units)
    scale = 2.0 / error.size
    return [scale * x.T @ error, scale * error.sum(axis=0)]


class MomentumSGDReference:
    """CNTK's momentum SGD (``variant="cntk"``) or Keras's classic momentum (``variant="keras"``).

    CNTK, with ``G = B * g`` and ``lr_s = learning_rate / B``::

        s = mu*s + (1-mu)*G   (unit gain)   or   s = mu*s + G
        w -= lr_s * s         (plain)       or   w -= lr_s * (mu*s + (1-mu)*G)  /  lr_s * (mu*s + G)

    Keras: ``v = mu*v - lr*g; w += v`` or, with Nesterov, ``w += mu*v - lr*g``.
    """

    def __init__(self, weights, *, nesterov=False, unit_gain=True, variant="cntk"):
        self.weights = [np.array(w, dtype=np.float64) for w in weights]
        self.buffers = [np.zeros_like(w) for w in self.weights]
        self.nesterov = nesterov
        self.unit_gain = unit_gain
        self.variant = variant

    def step(self, x, y, *, learning_rate: float, momentum: float) -> list[np.ndarray]:
        """Take one step on the minibatch ``(x, y)``; return the new weights."""
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        batch = len(x)
        mu = momentum
        for w, s, g in zip(self.weights, self.buffers, mse_gradients(self.weights, x, y), strict=True):
            if self.variant == "keras":
                s[...] = mu * s - learning_rate * g
                w += mu * s - learning_rate * g if self.nesterov else s
                continue
            summed = batch * g
            fresh = (1.0 - mu) * summed if self.unit_gain else summed
            s[...] = mu * s + fresh
            direction = mu * s + fresh if self.nesterov else s
            w -= learning_rate / batch * direction
        return [w.copy() for w in self.weights]


class AdamReference:
    """Adam whose bias correction uses the product ``P`` of the ``beta_1`` values used so far.

    At step ``t``, with the ``b1`` in force at that step::

        P *= b1; m += (1-b1)*(g-m); v += (1-b2)*(g**2-v)
        w -= lr * sqrt(1 - b2**t) / (1 - P) * m / (sqrt(v) + eps)
    """

    def __init__(self, weights, *, beta_2=0.999, epsilon=1e-7):
        self.weights = [np.array(w, dtype=np.float64) for w in weights]
        self.m = [np.zeros_like(w) for w in self.weights]
        self.v = [np.zeros_like(w) for w in self.weights]
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.t = 0
        self.beta_1_power = 1.0

    def step(self, x, y, *, learning_rate: float, beta_1: float) -> list[np.ndarray]:
        """Take one step on the minibatch ``(x, y)``; return the new weights."""
        grads = mse_gradients(self.weights, np.asarray(x, np.float64), np.asarray(y, np.float64))
        self.t += 1
        self.beta_1_power *= beta_1
        alpha = learning_rate * np.sqrt(1 - self.beta_2**self.t) / (1 - self.beta_1_power)
        for w, m, v, g in zip(self.weights, self.m, self.v, grads, strict=True):
            m += (1 - beta_1) * (g - m)
            v += (1 - self.beta_2) * (g * g - v)
            w -= alpha * m / (np.sqrt(v) + self.epsilon)
        return [w.copy() for w in self.weights]
