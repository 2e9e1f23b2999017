"""The models of the papers' experiments, sized for the datasets we ship.

* ``cnn``: the ~420k-parameter CNN of the FedRevive paper's FEMNIST task
  (two 3x3 conv layers, 32 and 64 channels, 2x2 pooling, a 128-unit dense layer),
  for 28x28 inputs, optionally with BatchNorm after each convolution, or with
  statistics trackers there (FedRevive's reference networks: running statistics
  recorded for its synthesis, activations not normalised).
* ``lenet5``: LeCun et al., 1998, for 28x28 or 32x32 inputs.
* ``resnet18``: He et al., 2016, the CIFAR variant (3x3 stem, no max-pool).
* ``mlp``: a one-hidden-layer perceptron, any input size (fast tests, ``digits``).
"""

from __future__ import annotations

import torch
from torch import nn

from asyncfl.errors import ConfigError

MODELS = ("cnn", "lenet5", "resnet18", "mlp")


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class MaxPool2x2(nn.Module):
    """2x2 max-pooling, stride 2, as ``nn.MaxPool2d(2)``; forward-only CPU passes use the channels-last kernel.

    On the CPUs measured, Torch's default (NCHW) max-pool forward was the slowest
    op of inference (FedRevive's teacher passes) and the channels-last kernel was
    faster, layout copies included (measured: benchmarks/fedrevive/README.md,
    "FedRevive server overhead"). With gradients the channels-last backward was
    slower, so training keeps the plain kernel. Outputs and gradients are
    bitwise the same either way (tested), and the result is handed back in the
    usual layout.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dim() != 4 or (torch.is_grad_enabled() and x.requires_grad):
            return nn.functional.max_pool2d(x, 2)
        return nn.functional.max_pool2d(x.contiguous(memory_format=torch.channels_last), 2).contiguous()


class StatisticsTracker(nn.BatchNorm2d):
    """Records its input's running mean and variance (as BatchNorm does) and passes the input on unchanged.

    FedRevive's reference networks put such layers where BatchNorm would go: the data-free
    synthesis matches a teacher's recorded feature statistics (its Eq. 4 feature term; a
    BatchNorm2d subclass, so :class:`~asyncfl.strategies.revive.synthesis.BatchNormStatistics`
    finds it), while activations are never normalised by them, so statistics that stale deltas
    push off (a negative running variance) cannot break a model's outputs. Statistics are
    recorded in training mode only.
    """

    def __init__(self, channels: int) -> None:
        super().__init__(channels, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():  # updates running_mean / running_var in place, as BatchNorm's training pass
                nn.functional.batch_norm(x, self.running_mean, self.running_var, training=True,
                                         momentum=self.momentum, eps=self.eps)
        return x


class CNN(nn.Module):
    """FedRevive's FEMNIST-size CNN (~420k parameters for 10 classes).

    ``batchnorm`` puts BatchNorm after each convolution, ``track_statistics`` a
    :class:`StatisticsTracker` instead (the two exclude each other).
    """

    def __init__(self, in_channels: int, num_classes: int, batchnorm: bool = False,
                 track_statistics: bool = False) -> None:
        super().__init__()
        if batchnorm and track_statistics:
            raise ConfigError("model 'cnn': choose BatchNorm or statistics trackers, not both")

        def block(cin: int, cout: int) -> list[nn.Module]:
            layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1)]
            if batchnorm:
                layers.append(nn.BatchNorm2d(cout))
            if track_statistics:
                layers.append(StatisticsTracker(cout))
            return layers + [nn.ReLU(), MaxPool2x2()]

        self.features = nn.Sequential(*block(in_channels, 32), *block(32, 64))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al., 1998); 28x28 inputs are padded to 32x32 by the first conv."""

    def __init__(self, in_channels: int, num_classes: int, side: int) -> None:
        super().__init__()
        pad = 2 if side == 28 else 0
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=pad), nn.ReLU(), MaxPool2x2(),
            nn.Conv2d(6, 16, 5), nn.ReLU(), MaxPool2x2(),
            nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with BatchNorm and an identity/projection shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18, CIFAR variant (He et al., 2016): 11.2M parameters for 10 classes."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)))


class MLP(nn.Module):
    """Flatten, one hidden ReLU layer, linear output."""

    def __init__(self, num_inputs: int, num_classes: int, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(num_inputs, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def build_model(
    name: str, input_shape: tuple[int, int, int], num_classes: int, batchnorm: bool = False, seed: int | None = None,
    track_statistics: bool = False,
) -> nn.Module:
    """Build model ``name`` for inputs ``(C, H, W)``; seeded initialisation when ``seed`` is given.

    ``batchnorm`` and ``track_statistics`` apply to ``cnn`` (see :class:`CNN`).

    Raises ``ConfigError`` (a ``ValueError``) naming the valid models, or the input sizes a model accepts.
    """
    channels, height, width = input_shape
    if track_statistics and name != "cnn":
        raise ConfigError(f"statistics trackers (model.track-statistics) are built into 'cnn' only, not {name!r}")
    if seed is not None:
        torch.manual_seed(seed)
    if name == "cnn":
        if (height, width) != (28, 28):
            raise ConfigError(f"model 'cnn' needs 28x28 inputs, the dataset has {height}x{width}; use 'mlp' or 'lenet5'")
        return CNN(channels, num_classes, batchnorm, track_statistics)
    if name == "lenet5":
        if (height, width) not in ((28, 28), (32, 32)):
            raise ConfigError(f"model 'lenet5' needs 28x28 or 32x32 inputs, the dataset has {height}x{width}")
        return LeNet5(channels, num_classes, height)
    if name == "resnet18":
        if height < 8 or width < 8:
            raise ConfigError(f"model 'resnet18' needs inputs of at least 8x8, the dataset has {height}x{width}")
        return ResNet18(channels, num_classes)
    if name == "mlp":
        return MLP(channels * height * width, num_classes)
    raise ConfigError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
