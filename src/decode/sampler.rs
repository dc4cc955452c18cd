//! Token sampling: greedy or temperature with top-k / top-p, seeded and reproducible.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};

/// How the next token is chosen from the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// Always the highest logit (lowest id on ties).
    Greedy,
    /// Softmax at `temperature`, optionally restricted to the `top_k` best and the smallest set whose
    /// probability reaches `top_p`.
    Random { temperature: f32, top_k: Option<usize>, top_p: Option<f32> },
}

impl Sampling {
    /// Greedy when `temperature <= 0`, random otherwise; validates the parameters.
    pub fn from_params(temperature: f32, top_k: Option<usize>, top_p: Option<f32>) -> Result<Self> {
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(Error::param("temperature", format!("must be >= 0, got {temperature}")));
        }
        if let Some(p) = top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(Error::param("top-p", format!("must be in (0, 1], got {p}")));
            }
        }
        if top_k == Some(0) {
            return Err(Error::param("top-k", "must be at least 1"));
        }
        Ok(if temperature == 0.0 { Sampling::Greedy } else { Sampling::Random { temperature, top_k, top_p } })
    }
}

/// A sampler with its own seeded random stream.
pub struct Sampler {
    sampling: Sampling,
    rng: StdRng,
    scratch: Vec<(u32, f32)>,
}

/// Index of the largest finite value (first on ties); `None` when every value is `-inf`/NaN.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() || v == f32::NEG_INFINITY {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i as u32)
}

impl Sampler {
    pub fn new(sampling: Sampling, seed: u64) -> Self {
        Self { sampling, rng: StdRng::seed_from_u64(seed), scratch: Vec::new() }
    }

    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    /// Picks a token. Tokens whose logit is `-inf` (masked) are never chosen; `None` if all are.
    pub fn sample(&mut self, logits: &[f32]) -> Option<u32> {
        let (temperature, top_k, top_p) = match self.sampling {
            Sampling::Greedy => return argmax(logits),
            Sampling::Random { temperature, top_k, top_p } => (temperature, top_k, top_p),
        };
        let c = &mut self.scratch;
        c.clear();
        c.extend(logits.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(i, &v)| (i as u32, v / temperature)));
        if c.is_empty() {
            return None;
        }
        let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if let Some(k) = top_k {
            if k < c.len() {
                c.select_nth_unstable_by(k - 1, by_logit_desc);
                c.truncate(k);
            }
        }
        let max = c.iter().map(|x| x.1).fold(f32::NEG_INFINITY, f32::max);
        for x in c.iter_mut() {
            x.1 = (x.1 - max).exp();
        }
        if let Some(p) = top_p.filter(|&p| p < 1.0) {
            c.sort_unstable_by(by_logit_desc);
            let total: f32 = c.iter().map(|x| x.1).sum();
            let mut acc = 0.0;
            let mut keep = c.len();
            for (i, x) in c.iter().enumerate() {
                acc += x.1 / total;
                if acc >= p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
        } else {
            // A fixed order keeps the draw reproducible whatever order select_nth left.
            c.sort_unstable_by_key(|x| x.0);
        }
        let total: f32 = c.iter().map(|x| x.1).sum();
        let mut r = self.rng.random::<f32>() * total;
        for &(id, w) in c.iter() {
            if r < w {
                return Some(id);
            }
            r -= w;
        }
        c.last().map(|x| x.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_first_max_and_skips_masked() {
        let mut s = Sampler::new(Sampling::Greedy, 0);
        assert_eq!(s.sample(&[0.0, 3.0, 3.0, 1.0]), Some(1));
        assert_eq!(s.sample(&[f32::NEG_INFINITY, -5.0]), Some(1));
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 3]), None);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let sampling = Sampling::Random { temperature: 1.0, top_k: Some(3), top_p: None };
        let draw = |seed| {
            let mut s = Sampler::new(sampling, seed);
            (0..200).map(|_| s.sample(&logits).unwrap()).collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert_ne!(a, draw(8));
        // top-3 of logits with value 6*0.3: ids 6, 13, 20 (the first three with i % 7 == 6).
        let mut ids: Vec<u32> = a.clone();
        ids.sort_unstable();
        ids.dedup();
        assert!(ids.iter().all(|i| [6, 13, 20].contains(i)), "{ids:?}");
    }

    #[test]
    fn top_p_keeps_smallest_sufficient_set() {
        // One dominant token (p ~ 0.98) and top_p 0.5 leaves only it.
        let logits = [10.0, 6.0, 0.0, 0.0];
        let mut s = Sampler::new(Sampling::Random { temperature: 1.0, top_k: None, top_p: Some(0.5) }, 1);
        assert!((0..100).all(|_| s.sample(&logits) == Some(0)));
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        assert!(Sampling::from_params(-1.0, None, None).is_err());
        assert!(Sampling::from_params(1.0, Some(0), None).is_err());
        assert!(Sampling::from_params(1.0, None, Some(1.5)).is_err());
        assert_eq!(Sampling::from_params(0.0, None, None).unwrap(), Sampling::Greedy);
    }
}
