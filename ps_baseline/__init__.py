"""TensorFlow's own parameter-server training (the comparison mode for ringtrain)."""
