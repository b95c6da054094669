"""cnn-dp: the model as functions of a dict of parameters by canonical name."""

import mlx.core as mx
import mlx.nn as nn

# what the spec decided that only this file uses (the settings several files share: config.py)
COMPUTE_DTYPE = mx.float32  # forward and backward; parameters, loss and update in float32


# ----------------------------------------------------------------------------
# Model: pure functions over a flat dict of parameters keyed by canonical name.
def conv2d(x, weight, bias, stride, padding):
    """NCHW input, OIHW weight (the canonical layout), zero padding of `padding` on each side; MLX
    convolves channels-last (NHWC, OHWI)."""
    y = mx.conv2d(
        x.transpose(0, 2, 3, 1), weight.transpose(0, 2, 3, 1), stride=stride, padding=padding
    )
    y = y.transpose(0, 3, 1, 2)
    return y if bias is None else y + bias[None, :, None, None]


def pool2d(pool, x):
    """An mlx.nn pooling layer (channels-last) over an NCHW tensor."""
    return pool(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def cross_entropy(logits, targets):
    """Mean cross-entropy over every position, in float32: logits [..., classes], targets [...] ids."""
    logits = logits.astype(mx.float32).reshape(-1, logits.shape[-1])
    targets = targets.reshape(-1).astype(mx.int32)
    picked = mx.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    return (mx.logsumexp(logits, axis=-1) - picked).mean()


def forward(p, batch):
    """The model, in the compute dtype: a batch of inputs -> `fc2`."""
    images = batch["images"].astype(COMPUTE_DTYPE)
    conv1 = conv2d(images, p["conv1.weight"], p["conv1.bias"], stride=(1, 1), padding=(0, 0))
    relu1 = nn.relu(conv1)
    # padded positions hold -inf, so they never win
    pool1 = pool2d(nn.MaxPool2d((2, 2), stride=(2, 2), padding=(0, 0)), relu1)
    flat = pool1.reshape(pool1.shape[0], -1)
    fc1 = flat @ p["fc1.weight"] + p["fc1.bias"]
    relu2 = nn.relu(fc1)
    fc2 = relu2 @ p["fc2.weight"] + p["fc2.bias"]
    return fc2


def loss_fn(params, buffers, batch, key):
    """The mean loss of one micro-batch (float32) and the updated buffers. Parameters are stored in float32
    and cast to COMPUTE_DTYPE here, so their gradients come back in float32."""
    p = {name: w.astype(COMPUTE_DTYPE) for name, w in params.items()}
    fc2 = forward(p, batch)
    labels = batch["labels"]
    return cross_entropy(fc2, labels), buffers
