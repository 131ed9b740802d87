"""Optimizers whose changing hyperparameters are backend variables, and the lookup that schedules use.

Keras keeps ``SGD.momentum`` and ``Adam.beta_1`` as Python floats compiled into the train step, so a
change during training is silently ignored on TensorFlow and JAX. :class:`MomentumSGD` and :class:`Adam`
keep them in variables of ``optimizer.variables``; :func:`hyperparameter_variable` finds the variable a
schedule must assign on any optimizer, or says what to use instead.
"""

from ._adam import Adam
from ._hyperparameters import hyperparameter_variable, minibatch_size_variable
from ._momentum_sgd import MomentumSGD

__all__ = ["Adam", "MomentumSGD", "hyperparameter_variable", "minibatch_size_variable"]
