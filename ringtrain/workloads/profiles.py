"""Parameter shapes of the models the Horovod paper and tf_cnn_benchmarks
measured, for the simulated accelerator (workloads/simulated.py): the
gradients are exactly as large as the real models', the compute is a wait.

Layer by layer, as Keras' applications build them (convolutions with a bias,
batch-norm gamma and beta; the moving statistics are not trained, so they
have no gradient and are left out):
  resnet50:  54 layers, 25,583,592 trainable parameters (Keras: 25,583,592)
  resnet101: 105 layers, 44,601,832 trainable parameters (Keras: 44,601,832)
  vgg16:    16 layers, 138,357,544 parameters (Keras: 138,357,544)
"""


def resnet50():
    return _resnet((3, 4, 6, 3))


def resnet101():
    return _resnet((3, 4, 23, 3))


def _resnet(blocks_per_stage):
    layers = []

    def conv(name, size, c_in, c_out):
        layers.append((name, [("kernel", (size, size, c_in, c_out)), ("bias", (c_out,)),
                              ("bn_gamma", (c_out,)), ("bn_beta", (c_out,))]))

    conv("conv1", 7, 3, 64)
    c_in = 64
    for stage, (blocks, width) in enumerate(zip(blocks_per_stage, (64, 128, 256, 512)), start=2):
        for block in range(1, blocks + 1):
            name = f"conv{stage}_block{block}"
            if block == 1:
                conv(f"{name}_0", 1, c_in, 4 * width)  # the projection shortcut
            conv(f"{name}_1", 1, c_in, width)
            conv(f"{name}_2", 3, width, width)
            conv(f"{name}_3", 1, width, 4 * width)
            c_in = 4 * width
    layers.append(("predictions", [("kernel", (2048, 1000)), ("bias", (1000,))]))
    return layers


def vgg16():
    layers, c_in = [], 3
    for block, (convs, width) in enumerate([(2, 64), (2, 128), (3, 256), (3, 512), (3, 512)], start=1):
        for i in range(1, convs + 1):
            layers.append((f"block{block}_conv{i}", [("kernel", (3, 3, c_in, width)), ("bias", (width,))]))
            c_in = width
    for name, (fan_in, fan_out) in (("fc1", (25088, 4096)), ("fc2", (4096, 4096)), ("predictions", (4096, 1000))):
        layers.append((name, [("kernel", (fan_in, fan_out)), ("bias", (fan_out,))]))
    return layers


PROFILES = {"resnet50": resnet50, "resnet101": resnet101, "vgg16": vgg16}


def classes(layers):
    """A profile's class count: the width of its last layer's kernel."""
    return layers[-1][1][0][1][-1]
