"""Side-by-side benchmarks of tf_loss_scale against TensorFlow's and Keras's wrappers."""
