"""ResNet deploy nets in the style of KaimingHe/deep-residual-networks (Convolution, BatchNorm, Scale, ReLU,
Eltwise), for any depth of the bottleneck family: 50 = [3, 4, 6, 3], 101 = [3, 4, 23, 3], 152 = [3, 8, 36, 3].
The zoo has ResNet-50; the benchmarks need a ResNet-152-sized net too."""

from __future__ import annotations

BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def _conv(lines: list[str], name: str, bottom: str, out: int, kernel: int, stride: int, pad: int, relu: bool) -> str:
    lines.append(
        f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" convolution_param {{ '
        f"num_output: {out} kernel_size: {kernel} pad: {pad} stride: {stride} bias_term: false }} }}"
    )
    lines.append(f'layer {{ name: "bn_{name}" type: "BatchNorm" bottom: "{name}" top: "{name}" '
                 "batch_norm_param { use_global_stats: true } }")
    lines.append(f'layer {{ name: "scale_{name}" type: "Scale" bottom: "{name}" top: "{name}" '
                 "scale_param { bias_term: true } }")
    if relu:
        lines.append(f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}')
    return name


def resnet_deploy(depth: int = 152, image: int = 224, batch: int = 1) -> str:
    stages = BLOCKS[depth]
    lines = [
        f'name: "ResNet-{depth}"',
        'input: "data"',
        f"input_dim: {batch}", "input_dim: 3", f"input_dim: {image}", f"input_dim: {image}",
    ]
    x = _conv(lines, "conv1", "data", 64, 7, 2, 3, relu=True)
    lines.append(f'layer {{ name: "pool1" type: "Pooling" bottom: "{x}" top: "pool1" '
                 "pooling_param { kernel_size: 3 stride: 2 pool: MAX } }")
    x = "pool1"
    width = 64
    for stage, blocks in enumerate(stages, start=2):
        for block in range(blocks):
            name = f"res{stage}{chr(ord('a') + block) if blocks <= 26 else f'b{block}'}"
            stride = 2 if block == 0 and stage > 2 else 1
            shortcut = x
            if block == 0:
                shortcut = _conv(lines, f"{name}_branch1", x, width * 4, 1, stride, 0, relu=False)
            a = _conv(lines, f"{name}_branch2a", x, width, 1, stride, 0, relu=True)
            b = _conv(lines, f"{name}_branch2b", a, width, 3, 1, 1, relu=True)
            c = _conv(lines, f"{name}_branch2c", b, width * 4, 1, 1, 0, relu=False)
            lines.append(f'layer {{ name: "{name}" type: "Eltwise" bottom: "{shortcut}" bottom: "{c}" top: "{name}" }}')
            lines.append(f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}')
            x = name
        width *= 2
    lines.append(f'layer {{ name: "pool5" type: "Pooling" bottom: "{x}" top: "pool5" '
                 "pooling_param { kernel_size: 7 stride: 1 pool: AVE } }")
    lines.append('layer { name: "fc1000" type: "InnerProduct" bottom: "pool5" top: "fc1000" '
                 "inner_product_param { num_output: 1000 } }")
    lines.append('layer { name: "prob" type: "Softmax" bottom: "fc1000" top: "prob" }')
    return "\n".join(lines) + "\n"
