//! Fused ops of a Stable Diffusion UNet/VAE on Candle tensors, one API on every device: on
//! a [`RocmDevice`] they run `kernels` kernels, on `Device::Cpu` plain Candle ops.
//! Arguments are checked first; an error names the argument and nothing is written.
//!
//! - [`group_norm`]: GroupNorm over `(batch, channels, ..)` with the affine map and an
//!   optional SiLU in one kernel (`kernels::norm::group_norm`), in place of candle-nn's
//!   `GroupNorm`, which composes it of about ten elementwise and reduction ops.
//!
//! candle-transformers' UNet and VAE build candle-nn `GroupNorm`s, which the candle-nn
//! patch routes to `FusedOp::GroupNorm` on an external device, and the candle-transformers
//! patch calls `GroupNorm::forward_silu` (`FusedOp::GroupNormSilu`) where SiLU follows the
//! norm: on a [`RocmDevice`] both are this kernel. Its attention blocks
//! (`CrossAttention`, f16/bf16 heads up to 256) go through `candle_nn::ops::sdpa_bshd`
//! (`FusedOp::Attention`) to the flash-attention prefill kernel.
use crate::llm_ops::{check_float, check_peer, region, tensor, with_buf};
use crate::error::{at, invalid};
use crate::ops::float_dispatch;
use crate::RocmDevice;
use candle_core::{Module, Result, Tensor};

/// GroupNorm of `x` (`[batch, channels, ..]`, Candle's `GroupNorm` layout) over `groups`
/// groups of `channels / groups` channels: `y = (x - mean) / sqrt(var + eps) * weight[c] +
/// bias[c]` (statistics in f32 per batch entry and group; `weight`/`bias` `[channels]`,
/// `None`: 1 / 0), then `SiLU(y)` when `silu`. One kernel on a [`RocmDevice`];
/// `Device::Cpu`: candle-nn's `GroupNorm` (and Candle's `silu`).
pub fn group_norm(x: &Tensor, groups: usize, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64, silu: bool) -> Result<Tensor> {
    const OP: &str = "group_norm";
    check_float(OP, "x", x)?;
    let dims = x.dims();
    if dims.len() < 2 {
        return Err(invalid(OP, format!("`x` has shape {dims:?}; [batch, channels, ..] expected")));
    }
    let c = dims[1];
    if groups == 0 || !c.is_multiple_of(groups) {
        return Err(invalid(OP, format!("{c} channels do not split into {groups} groups")));
    }
    for (name, p) in [("weight", weight), ("bias", bias)] {
        if let Some(p) = p {
            check_peer(OP, name, p, x.dtype(), x.device())?;
            if p.dims() != [c] {
                return Err(invalid(OP, format!("`{name}` has shape {:?}; [{c}] expected", p.dims())));
            }
        }
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(invalid(OP, format!("`eps` must be finite and >= 0, got {eps}")));
    }
    let Some(dev) = RocmDevice::from_candle(x.device()) else {
        let w = match weight {
            Some(w) => w.clone(),
            None => Tensor::ones(c, x.dtype(), x.device())?,
        };
        let b = match bias {
            Some(b) => b.clone(),
            None => Tensor::zeros(c, x.dtype(), x.device())?,
        };
        let y = candle_nn::GroupNorm::new(w, b, c, groups, eps)?.forward(x)?;
        return if silu { y.silu() } else { Ok(y) };
    };
    let spatial: usize = dims[2..].iter().product();
    let x = x.contiguous()?;
    let (weight, bias) = (weight.map(|w| w.contiguous()).transpose()?, bias.map(|b| b.contiguous()).transpose()?);
    let (kd, n) = (dev.kernels(), x.elem_count());
    let buf = with_buf(OP, "x", &x, |xb, xl| {
        let xr = region(OP, "x", xb, xl)?;
        let run = |wr: Option<crate::buffer::Region>, br: Option<crate::buffer::Region>| -> Result<crate::buffer::Buf> {
            float_dispatch!(x.dtype(), OP, T => {
                let mut y = crate::ops::alloc::<T>(kd, n, OP)?;
                if n > 0 {
                    let w = wr.as_ref().map(|r| r as &dyn kernel_dsl::host::KernelArgSlice<T>);
                    let b = br.as_ref().map(|r| r as &dyn kernel_dsl::host::KernelArgSlice<T>);
                    kernels::norm::group_norm_rows::<T>(kd, &xr, w, b, &mut y, (c, spatial), groups, eps as f32, silu).map_err(at(OP))?;
                }
                Ok(crate::buffer::BufElem::wrap(y))
            })
        };
        let with_b = |wr: Option<crate::buffer::Region>| match &bias {
            Some(b) => with_buf(OP, "bias", b, |bb, bl| run(wr, Some(region(OP, "bias", bb, bl)?))),
            None => run(wr, None),
        };
        match &weight {
            Some(w) => with_buf(OP, "weight", w, |wb, wl| with_b(Some(region(OP, "weight", wb, wl)?))),
            None => with_b(None),
        }
    })?;
    Ok(tensor(dev, buf, dims))
}
