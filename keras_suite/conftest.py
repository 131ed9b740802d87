"""Keras's own ``conftest.py``, vendored (the minimal part) to run Keras's test files from the installed wheel.

Keras's test files (``site-packages/keras/src/**/*_test.py``) expect the ``conftest.py`` at the root of the
Keras repository: it declares the ``requires_trainable_backend`` and ``multi_device`` marks, imports torch
before TensorFlow, and ``remote_monitor_test.py`` does ``from conftest import skip_if_backend``. The wheel
does not ship it, so ``scripts/keras_suite.sh`` puts this folder on ``PYTHONPATH`` and loads this module
with ``-p conftest``.

Vendored from https://github.com/keras-team/keras/blob/master/conftest.py (commit 3422977a5e). Left out:
the OpenVINO exclusion list (kfit supports TensorFlow, JAX and PyTorch) and the GPU TF32 switches (the
suite runs on CPU). Outside kfit's ``testpaths``: kfit's own test run never loads it (its name would shadow ``tests/conftest.py``).
"""

try:
    # As in Keras: torch is imported first, otherwise importing it after TensorFlow may segfault.
    import torch  # noqa: F401
except ImportError:
    torch = None

import pytest  # noqa: E402


def _backend():
    from keras.src.backend import backend

    return backend()


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_trainable_backend: mark test for trainable backend only")
    config.addinivalue_line("markers", "multi_device: mark test for running with multiple devices only")


def pytest_collection_modifyitems(config, items):
    has_multiple_devices = False
    if _backend() == "jax":
        import jax

        has_multiple_devices = jax.device_count() > 1
    requires_trainable_backend = pytest.mark.skipif(
        _backend() in ["numpy", "openvino"],
        reason="Trainer not implemented for NumPy and OpenVINO backend.",
    )
    requires_multiple_devices = None if has_multiple_devices else pytest.mark.skip(reason="Requires multiple devices")
    for item in items:
        if "requires_trainable_backend" in item.keywords:
            item.add_marker(requires_trainable_backend)
        if requires_multiple_devices and "multi_device" in item.keywords:
            item.add_marker(requires_multiple_devices)


def skip_if_backend(given_backend, reason):
    return pytest.mark.skipif(_backend() == given_backend, reason=reason)
