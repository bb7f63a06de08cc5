//! Noise schedulers: candle-transformers' DDIM (deterministic, eta 0), and Euler ancestral
//! with its per-step noise drawn on the host from the request's seed (candle-transformers'
//! version draws it with `randn_like` on the tensor's device, so the image would depend on
//! the device's random generator).

use candle_core::{bail, Device, Result, Tensor};
use candle_transformers::models::stable_diffusion::ddim::DDIMSchedulerConfig;
use candle_transformers::models::stable_diffusion::schedulers::{PredictionType, Scheduler, SchedulerConfig, TimestepSpacing};
use rand::SeedableRng;
use rand_distr::Distribution;

/// The schedulers the worker offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulerKind {
    /// DDIM, eta 0, "leading" timesteps (SD 1.5/2.1/SDXL's default).
    Ddim,
    /// Euler ancestral, "leading" timesteps.
    EulerAncestral,
    /// Euler ancestral, "trailing" timesteps (SDXL Turbo's).
    EulerAncestralTrailing,
}

impl SchedulerKind {
    /// A scheduler of `steps` steps; `seed` seeds the ancestral noise (its stream is
    /// independent of the initial latent's).
    pub fn build(self, steps: usize, prediction: PredictionType, seed: u64) -> Result<Box<dyn Scheduler>> {
        match self {
            SchedulerKind::Ddim => DDIMSchedulerConfig { prediction_type: prediction, ..Default::default() }.build(steps),
            SchedulerKind::EulerAncestral => Ok(Box::new(EulerAncestral::new(steps, prediction, TimestepSpacing::Leading, seed)?)),
            SchedulerKind::EulerAncestralTrailing => Ok(Box::new(EulerAncestral::new(steps, prediction, TimestepSpacing::Trailing, seed)?)),
        }
    }
}

const TRAIN_STEPS: usize = 1000;

/// Euler ancestral sampling (Karras et al.'s k-diffusion `sample_euler_ancestral`, as
/// diffusers' `EulerAncestralDiscreteScheduler`) over SD's scaled-linear betas
/// (0.00085 to 0.012 over 1000 training steps).
pub struct EulerAncestral {
    timesteps: Vec<usize>,
    /// sigma at each timestep, then 0.
    sigmas: Vec<f64>,
    init_sigma: f64,
    prediction: PredictionType,
    rng: rand_chacha::ChaCha8Rng,
}

impl EulerAncestral {
    pub fn new(steps: usize, prediction: PredictionType, spacing: TimestepSpacing, seed: u64) -> Result<Self> {
        if steps == 0 || steps > TRAIN_STEPS {
            bail!("Euler ancestral: {steps} steps (1 to {TRAIN_STEPS})");
        }
        let ratio = TRAIN_STEPS / steps;
        let timesteps: Vec<usize> = match spacing {
            TimestepSpacing::Leading => (0..steps).map(|s| s * ratio + 1).rev().collect(),
            TimestepSpacing::Trailing => (0..steps).map(|s| TRAIN_STEPS - s * ratio - 1).collect(),
            TimestepSpacing::Linspace => bail!("Euler ancestral: linspace timesteps are not offered"),
        };
        let (b0, b1) = (0.00085f64.sqrt(), 0.012f64.sqrt());
        let mut cum = 1.0;
        let all: Vec<f64> = (0..TRAIN_STEPS)
            .map(|i| {
                let b = b0 + (b1 - b0) * i as f64 / (TRAIN_STEPS - 1) as f64;
                cum *= 1.0 - b * b;
                ((1.0 - cum) / cum).sqrt()
            })
            .collect();
        let mut sigmas: Vec<f64> = timesteps.iter().map(|&t| all[t.min(TRAIN_STEPS - 1)]).collect();
        sigmas.push(0.0);
        let max = sigmas.iter().cloned().fold(0.0, f64::max);
        let init_sigma = match spacing {
            TimestepSpacing::Leading => (max * max + 1.0).sqrt(),
            _ => max,
        };
        // Decorrelated from the initial latent's stream (seeded with `seed` itself).
        let rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        Ok(Self { timesteps, sigmas, init_sigma, prediction, rng })
    }

    fn index(&self, t: usize) -> Result<usize> {
        match self.timesteps.iter().position(|&x| x == t) {
            Some(i) => Ok(i),
            None => bail!("timestep {t} is not one of this scheduler's"),
        }
    }
}

impl Scheduler for EulerAncestral {
    fn timesteps(&self) -> &[usize] {
        &self.timesteps
    }

    fn add_noise(&self, original: &Tensor, noise: Tensor, timestep: usize) -> Result<Tensor> {
        original + (noise * self.sigmas[self.index(timestep)?])?
    }

    fn init_noise_sigma(&self) -> f64 {
        self.init_sigma
    }

    fn scale_model_input(&self, sample: Tensor, timestep: usize) -> Result<Tensor> {
        let s = self.sigmas[self.index(timestep)?];
        sample / (s * s + 1.0).sqrt()
    }

    fn step(&mut self, model_output: &Tensor, timestep: usize, sample: &Tensor) -> Result<Tensor> {
        let i = self.index(timestep)?;
        let (from, to) = (self.sigmas[i], self.sigmas[i + 1]);
        let x0 = match self.prediction {
            PredictionType::Epsilon => (sample - (model_output * from)?)?,
            PredictionType::VPrediction => ((model_output * (-from / (from * from + 1.0).sqrt()))? + (sample / (from * from + 1.0))?)?,
            PredictionType::Sample => model_output.clone(),
        };
        let up = (to * to * (from * from - to * to) / (from * from)).sqrt();
        let down = (to * to - up * up).sqrt();
        let derivative = ((sample - x0)? / from)?;
        let prev = (sample + (derivative * (down - from))?)?;
        let n = prev.elem_count();
        let noise: Vec<f32> = (0..n).map(|_| rand_distr::StandardNormal.sample(&mut self.rng)).collect();
        let noise = Tensor::from_vec(noise, prev.shape(), &Device::Cpu)?.to_dtype(prev.dtype())?.to_device(prev.device())?;
        prev + (noise * up)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_transformers::models::stable_diffusion::euler_ancestral_discrete::EulerAncestralDiscreteSchedulerConfig;

    fn t(seed: u64) -> Tensor {
        crate::host_noise(seed, &[1, 4, 3, 5]).unwrap()
    }

    /// Against candle-transformers' scheduler: the same timesteps, initial sigma and input
    /// scaling, and the same last step (sigma_to = 0: no ancestral noise, so it is
    /// deterministic on both sides). Trailing spacing only for step counts dividing 1000
    /// (candle-transformers' trailing list gets an extra step otherwise).
    #[test]
    fn euler_ancestral_matches_candle_transformers() {
        for (spacing, steps) in [(TimestepSpacing::Leading, 1), (TimestepSpacing::Leading, 7), (TimestepSpacing::Leading, 30), (TimestepSpacing::Trailing, 1), (TimestepSpacing::Trailing, 4), (TimestepSpacing::Trailing, 25)] {
            for prediction in [PredictionType::Epsilon, PredictionType::VPrediction] {
                let mut ours = EulerAncestral::new(steps, prediction, spacing, 3).unwrap();
                let mut theirs = EulerAncestralDiscreteSchedulerConfig { prediction_type: prediction, timestep_spacing: spacing, ..Default::default() }.build(steps).unwrap();
                assert_eq!(ours.timesteps(), theirs.timesteps(), "{spacing:?} {steps}");
                let (a, b) = (ours.init_noise_sigma(), theirs.init_noise_sigma());
                assert!((a - b).abs() <= 1e-12 * b, "{spacing:?} {steps}: init sigma {a} vs {b}");
                let ts = ours.timesteps().to_vec();
                for &ti in &ts {
                    let x = ours.scale_model_input(t(1), ti).unwrap();
                    let y = theirs.scale_model_input(t(1), ti).unwrap();
                    let d = (x - y).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                    assert!(d <= 1e-6, "{spacing:?} {steps}: scale at {ti}: {d}");
                }
                let last = *ts.last().unwrap();
                let x = ours.step(&t(2), last, &t(4)).unwrap();
                let y = theirs.step(&t(2), last, &t(4)).unwrap();
                let d = (x - y).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                assert!(d <= 1e-5, "{spacing:?} {steps}: last step differs by {d}");
            }
        }
    }

    /// The ancestral noise depends on the seed only (the same draw on every run).
    #[test]
    fn euler_ancestral_noise_is_seeded() {
        let run = |seed| {
            let mut s = EulerAncestral::new(4, PredictionType::Epsilon, TimestepSpacing::Leading, seed).unwrap();
            let t0 = s.timesteps()[0];
            s.step(&t(2), t0, &t(4)).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        assert_eq!(run(9), run(9));
        assert_ne!(run(9), run(10));
    }
}
