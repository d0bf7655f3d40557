"""The torch side of two paddle.vision models, written the way torchvision writes them.

torchvision's wheel does not load beside the CPU torch we pin, so these follow its code:
in-place residual adds, ``inplace=True`` activations and Conv-Norm-Activation wrappers
(a ``Sequential`` subclass), the patterns that trip a recorder holding references.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(64, 1)
        self.layer2 = self._layer(128, 2)
        self.layer3 = self._layer(256, 2)
        self.layer4 = self._layer(512, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def _layer(self, planes: int, stride: int) -> nn.Sequential:
        down = None
        if stride != 1 or self.inplanes != planes:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        blocks = [BasicBlock(self.inplanes, planes, stride, down), BasicBlock(planes, planes)]
        self.inplanes = planes
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Conv2dNormActivation(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1, act: bool = True):
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if act:
            layers.append(nn.ReLU6(inplace=True))
        super().__init__(*layers)


def _divisible(v: float, d: int = 8) -> int:
    new = max(d, int(v + d / 2) // d * d)
    return new + d if new < 0.9 * v else new


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = int(round(inp * expand))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(Conv2dNormActivation(inp, hidden, 1))
        layers += [
            Conv2dNormActivation(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    SETTING = [
        [1, 16, 1, 1],
        [6, 24, 2, 2],
        [6, 32, 3, 2],
        [6, 64, 4, 2],
        [6, 96, 3, 1],
        [6, 160, 3, 2],
        [6, 320, 1, 1],
    ]

    def __init__(self, scale: float = 0.25, num_classes: int = 10) -> None:
        super().__init__()
        cin = _divisible(32 * scale)
        last = _divisible(1280 * max(1.0, scale))
        feats: list[nn.Module] = [Conv2dNormActivation(3, cin, stride=2)]
        for t, c, n, s in self.SETTING:
            cout = _divisible(c * scale)
            for i in range(n):
                feats.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        feats.append(Conv2dNormActivation(cin, last, 1))
        self.features = nn.Sequential(*feats)
        self.pool2d_avg = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool2d_avg(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(b, -1, h, w)


class ShuffleUnit(nn.Module):
    """torchvision's ShuffleNetV2 unit: each branch one flat ``Sequential`` (paddle.vision wraps each
    conv in a Conv-Norm-Activation), the split and concatenation in the unit's own code."""

    def __init__(self, inp: int, oup: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        branch = oup // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False),
                nn.BatchNorm2d(inp),
                nn.Conv2d(inp, branch, 1, 1, 0, bias=False),
                nn.BatchNorm2d(branch),
                nn.ReLU(inplace=True),
            )
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if stride > 1 else branch, branch, 1, 1, 0, bias=False),
            nn.BatchNorm2d(branch),
            nn.ReLU(inplace=True),
            nn.Conv2d(branch, branch, 3, stride, 1, groups=branch, bias=False),
            nn.BatchNorm2d(branch),
            nn.Conv2d(branch, branch, 1, 1, 0, bias=False),
            nn.BatchNorm2d(branch),
            nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    """torchvision's layout: ``conv1``, ``maxpool``, ``stage2..4`` Sequentials, ``conv5``, ``fc``;
    paddle.vision keeps the units as siblings of the stem (``2_1``, ``2_2``...)."""

    def __init__(self, repeats=(4, 8, 4), channels=(24, 24, 48, 96, 512), num_classes: int = 10) -> None:
        super().__init__()
        cin = channels[0]
        self.conv1 = nn.Sequential(nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin), nn.ReLU(inplace=True))
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        for name, n, cout in zip(("stage2", "stage3", "stage4"), repeats, channels[1:]):
            setattr(
                self,
                name,
                nn.Sequential(ShuffleUnit(cin, cout, 2), *[ShuffleUnit(cout, cout, 1) for _ in range(n - 1)]),
            )
            cin = cout
        self.conv5 = nn.Sequential(
            nn.Conv2d(cin, channels[-1], 1, 1, 0, bias=False), nn.BatchNorm2d(channels[-1]), nn.ReLU(inplace=True)
        )
        self.fc = nn.Linear(channels[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.conv1(x))
        x = self.stage4(self.stage3(self.stage2(x)))
        return self.fc(self.conv5(x).mean([2, 3]))


class _DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        new = self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))
        return torch.cat([x, new], 1)


class _DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, cin: int, bn_size: int, growth: int) -> None:
        super().__init__()
        for i in range(layers):
            self.add_module(f"denselayer{i + 1}", _DenseLayer(cin + i * growth, growth, bn_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.values():
            x = layer(x)
        return x


class _Transition(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(cin, cout, 1, bias=False)
        self.pool = nn.AvgPool2d(2, 2)


class DenseNet121(nn.Module):
    """torchvision's DenseNet: one ``features`` Sequential; norm then ReLU modules where paddle.vision
    fuses the ReLU into ``BatchNorm(act="relu")``, and the last ReLU called as a function."""

    def __init__(self, num_classes: int = 10, growth: int = 32, blocks: tuple[int, ...] = (6, 12, 24, 16)) -> None:
        super().__init__()
        features = 64
        self.features = nn.Sequential()
        self.features.add_module("conv0", nn.Conv2d(3, features, 7, 2, 3, bias=False))
        self.features.add_module("norm0", nn.BatchNorm2d(features))
        self.features.add_module("relu0", nn.ReLU(inplace=True))
        self.features.add_module("pool0", nn.MaxPool2d(3, 2, 1))
        for i, layers in enumerate(blocks):
            self.features.add_module(f"denseblock{i + 1}", _DenseBlock(layers, features, 4, growth))
            features += layers * growth
            if i != len(blocks) - 1:
                self.features.add_module(f"transition{i + 1}", _Transition(features, features // 2))
                features //= 2
        self.features.add_module("norm5", nn.BatchNorm2d(features))
        self.classifier = nn.Linear(features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.features(x))
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


def _make_divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class _NormActivation(nn.Sequential):
    """torchvision's ``Conv2dNormActivation`` with MobileNetV3's norm (eps 1e-3, momentum 0.01)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: Any = None):
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout, eps=0.001, momentum=0.01),
        ]
        if act is not None:
            layers.append(act(inplace=True))
        super().__init__(*layers)


class InvertedResidualV3(nn.Module):
    """torchvision's MobileNetV3 block: everything in one ``block`` Sequential, where paddle.vision keeps
    ``expand_conv``, ``bottleneck_conv``, ``mid_se`` and ``linear_conv`` as the block's own."""

    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, hardswish: bool, stride: int):
        super().__init__()
        act = nn.Hardswish if hardswish else nn.ReLU
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(_NormActivation(cin, expanded, 1, act=act))
        layers.append(_NormActivation(expanded, expanded, kernel, stride, groups=expanded, act=act))
        if se:
            layers.append(SqueezeExcitation(expanded, _make_divisible(expanded // 4)))
        layers.append(_NormActivation(expanded, cout, 1))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


MOBILENET_V3_SMALL = (
    (16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2), (24, 3, 88, 24, False, False, 1),
    (24, 5, 96, 40, True, True, 2), (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
    (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1), (48, 5, 288, 96, True, True, 2),
    (96, 5, 576, 96, True, True, 1), (96, 5, 576, 96, True, True, 1),
)  # fmt: skip
"""torchvision's ``mobilenet_v3_small``: (in, kernel, expanded, out, squeeze-excitation, hardswish, stride)."""


class MobileNetV3Small(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [_NormActivation(3, 16, 3, 2, act=nn.Hardswish)]
        layers += [InvertedResidualV3(*cfg) for cfg in MOBILENET_V3_SMALL]
        layers.append(_NormActivation(96, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(576, 1024),
            nn.Hardswish(inplace=True),
            nn.Dropout(0.2, inplace=True),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class BasicConv2d(nn.Module):
    """torchvision's Inception conv: a wrapper holding no tensors of its own, its ReLU a function."""

    def __init__(self, cin: int, cout: int, **kwargs: Any) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(cout)  # paddle.vision's norm (torchvision's eps is 0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(cin, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(nn.functional.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b5, b3, bp], 1)


class InceptionNet(nn.Module):
    """A stem conv, two torchvision-style Inception-A blocks and a classifier."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.mixed_5b = InceptionA(32, 32)
        self.mixed_5c = InceptionA(256, 64)
        self.fc = nn.Linear(288, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mixed_5c(self.mixed_5b(self.stem(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
