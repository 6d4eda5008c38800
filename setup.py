"""Packaging for tf_loss_scale."""

import setuptools

setuptools.setup(
    name='tf_loss_scale',
    version='0.1.0',
    description=('Loss scaling for mixed precision training: the LossScale '
                 'API, the tf.compat.v1 optimizer wrapper and Keras 3 '
                 'LossScaleOptimizers on today\'s TensorFlow.'),
    packages=setuptools.find_packages(include=['tf_loss_scale',
                                               'tf_loss_scale.*']),
    python_requires='>=3.9',
    install_requires=[
        'tensorflow>=2.21,<2.22',
        'absl-py',
        'numpy',
    ],
    extras_require={
        # The tests run the demo too.
        'test': ['pytest', 'scikit-learn', 'matplotlib',
                 'tf_keras>=2.21,<2.22'],
        'demo': ['scikit-learn', 'matplotlib'],
        # Keras 2 inner optimizers for the TF 2.0-2.3 wrapper.
        'tf_keras': ['tf_keras>=2.21,<2.22'],
    },
    entry_points={
        'console_scripts': ['tf-loss-scale=tf_loss_scale.__main__:main'],
    },
)
