"""PyTorch (`diffusers`) peer of `sd-worker bench` (issue 32): one UNet step and one VAE decode
at the Stable Diffusion 1.5 and SDXL shapes, random weights, f16, SDPA attention.

The networks are built in code from the models' published configurations (no download):
`UNet2DConditionModel` and `AutoencoderKL` constructed on the GPU with diffusers' own
initialisers, cast to f16, attention through `torch.nn.functional.scaled_dot_product_attention`
(`AttnProcessor2_0`). Inputs as `sd-worker bench` feeds its own: a UNet batch of 2 (the
classifier-free guidance pair) of latents at 1/8 of the image size, text states of 77 tokens
(768 wide for SD 1.5, 2048 for SDXL, plus SDXL's pooled text embedding and size/crop ids);
a VAE decode of one latent. One untimed call each, then `--steps` UNet steps (timesteps 999,
998, ...) and `min(steps, 3)` decodes, each timed with CUDA events around the call.

usage: torch_sd.py [--out DIR] [--shapes sd15,sdxl] [--steps 5] [--batch 2] [--size WxH]
Prints and writes DIR/torch_sd.jsonl, one line per shape and op, in sd-worker's fields plus
`backend`. `--size` overrides the image size of every shape (quick checks).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

# The published configurations (runwayml/stable-diffusion-v1-5, stabilityai/stable-diffusion-xl-base-1.0),
# only what differs from diffusers' defaults; `attention_head_dim` is diffusers' name for the
# number of heads in these configs. The same values as workers/sd/src/lib.rs `Shape::config`.
UNETS = {
    "sd15": dict(
        sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(320, 640, 1280, 1280),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32),
    "sdxl": dict(
        sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
        use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816, norm_num_groups=32),
}
# Both use the same VAE architecture (SDXL's differs in weights and scale only).
VAE = dict(
    in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32,
    block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)
SIZES = {"sd15": (512, 512), "sdxl": (1024, 1024)}
TEXT_TOKENS = 77


def timed(fn, runs, cuda):
    fn()  # untimed: cuDNN/cuBLAS heuristics, allocator growth
    ms = []
    for i in range(runs):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(i)
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn(i)
            ms.append((time.perf_counter() - t) * 1e3)
    return ms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--shapes", default="sd15,sdxl")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--size", default=None, help="WxH for every shape (default: the shape's own)")
    p.add_argument("--device", default="cuda", help="cuda (default); cpu to check the script without a GPU")
    args = p.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        if s not in UNETS:
            sys.exit(f"unknown shape {s!r} ({', '.join(UNETS)})")
    if args.steps < 1 or args.batch < 1:
        sys.exit("--steps and --batch must be at least 1")

    import diffusers
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.models.attention_processor import AttnProcessor2_0

    dev, dt = torch.device(args.device), torch.float16
    cuda = dev.type == "cuda"
    dev_name = torch.cuda.get_device_name() if cuda else args.device
    sink = open(os.path.join(args.out, "torch_sd.jsonl"), "a")
    torch.manual_seed(0)
    for shape in shapes:
        w, h = (int(x) for x in args.size.split("x")) if args.size else SIZES[shape]
        if w % 8 or h % 8:
            sys.exit(f"{w}x{h}: width and height must be multiples of 8")

        def line(op, ms, batch, **extra):
            j = dict(shape=shape, op=op, backend="torch", device=dev_name, dtype="f16",
                     width=w, height=h, batch=batch, runs=len(ms), median_ms=statistics.median(ms), min_ms=min(ms),
                     ms=ms, torch=torch.__version__, diffusers=diffusers.__version__, **extra)
            print(json.dumps(j), flush=True)
            sink.write(json.dumps(j) + "\n")
            sink.flush()

        t0 = time.perf_counter()
        with torch.device(dev):
            unet = UNet2DConditionModel(**UNETS[shape]).to(dt).eval()
        unet.set_attn_processor(AttnProcessor2_0())
        params = sum(x.numel() for x in unet.parameters())
        print(f"{shape} UNet: {params / 1e6:.0f} M parameters, built in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        b = args.batch
        lat = torch.randn(b, 4, h // 8, w // 8, device=dev, dtype=dt)
        text = torch.randn(b, TEXT_TOKENS, UNETS[shape]["cross_attention_dim"], device=dev, dtype=dt)
        extra = {}
        if shape == "sdxl":
            # Pooled text embedding (1280) and the six size/crop ids (original size, crop, target size).
            ids = torch.tensor([h, w, 0, 0, h, w], device=dev, dtype=dt).repeat(b, 1)
            extra = dict(added_cond_kwargs=dict(text_embeds=torch.randn(b, 1280, device=dev, dtype=dt), time_ids=ids))
        with torch.inference_mode():
            ms = timed(lambda i=0: unet(lat, 999 - i, encoder_hidden_states=text, **extra).sample, args.steps, cuda)
        line("unet_step", ms, b, parameters=params)
        del unet
        if cuda:
            torch.cuda.empty_cache()

        with torch.device(dev):
            vae = AutoencoderKL(**VAE, sample_size=max(w, h)).to(dt).eval()
        vae.set_attn_processor(AttnProcessor2_0())
        z = lat[:1]
        with torch.inference_mode():
            ms = timed(lambda i=0: vae.decode(z).sample, min(args.steps, 3), cuda)
        line("vae_decode", ms, 1)
        del vae
        if cuda:
            torch.cuda.empty_cache()
    sink.close()


if __name__ == "__main__":
    main()
