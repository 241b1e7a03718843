//! Sample statistics for repeated measurements, as criterion reports them:
//! mean, standard deviation, min, max, median, outliers by Tukey's fences
//! (mild beyond 1.5 IQR, severe beyond 3 IQR) and the "variance
//! introduced by outliers" of Haskell criterion's `outlierVariance`.
//!
//! Why our own: criterion is a harness that owns `main` and the timing
//! loop, while `sockbench tcp` times whole transfers it drives itself.
//! Every function here is pure and total: empty or single samples give
//! zeros, never NaN or a panic.

use serde::Serialize;

/// How much the outliers inflate the variance (criterion's wording).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutlierEffect {
    /// Under 1% of the variance: "unaffected".
    Unaffected,
    /// Under 10%: "slightly inflated".
    Slight,
    /// Under 50%: "moderately inflated".
    Moderate,
    /// 50% or more: "severely inflated".
    Severe,
}

impl OutlierEffect {
    /// The phrase criterion prints after the percentage.
    pub fn phrase(self) -> &'static str {
        match self {
            OutlierEffect::Unaffected => "unaffected",
            OutlierEffect::Slight => "slightly inflated",
            OutlierEffect::Moderate => "moderately inflated",
            OutlierEffect::Severe => "severely inflated",
        }
    }
}

/// Counts of samples outside Tukey's fences.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Outliers {
    pub low_severe: usize,
    pub low_mild: usize,
    pub high_mild: usize,
    pub high_severe: usize,
}

impl Outliers {
    pub fn mild(&self) -> usize {
        self.low_mild + self.high_mild
    }
    pub fn severe(&self) -> usize {
        self.low_severe + self.high_severe
    }
    pub fn total(&self) -> usize {
        self.mild() + self.severe()
    }
}

/// Everything reported about one cell's samples.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub samples: usize,
    pub mean: f64,
    /// Sample standard deviation (n − 1 in the denominator).
    pub std_dev: f64,
    pub min: f64,
    pub max: f64,
    pub median: f64,
    pub outliers: Outliers,
    /// Fraction (0..=1) of the variance that outliers explain.
    pub outlier_variance: f64,
    pub effect: OutlierEffect,
}

pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Sample standard deviation; 0 for fewer than two samples.
pub fn std_dev(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64;
    var.sqrt()
}

/// The `p`-th percentile (0..=100) of sorted data, linearly interpolated
/// between the closest ranks (criterion's method).
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            let frac = rank - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

fn sorted(xs: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// Classifies samples by Tukey's fences around the quartiles.
pub fn classify_outliers(xs: &[f64]) -> Outliers {
    let s = sorted(xs);
    let mut out = Outliers::default();
    if s.len() < 4 {
        return out;
    }
    let q1 = percentile_sorted(&s, 25.0);
    let q3 = percentile_sorted(&s, 75.0);
    let iqr = q3 - q1;
    let (low_severe, low_mild) = (q1 - 3.0 * iqr, q1 - 1.5 * iqr);
    let (high_mild, high_severe) = (q3 + 1.5 * iqr, q3 + 3.0 * iqr);
    for &x in &s {
        if x < low_severe {
            out.low_severe += 1;
        } else if x < low_mild {
            out.low_mild += 1;
        } else if x > high_severe {
            out.high_severe += 1;
        } else if x > high_mild {
            out.high_mild += 1;
        }
    }
    out
}

/// Haskell criterion's `outlierVariance`: the share of the observed
/// variance explained by outliers, for `n` samples with mean `mu` and
/// standard deviation `sigma` (Kalibera and Jones' model of a benchmark
/// disturbed by a few slow events). Returns (fraction, effect).
pub fn outlier_variance(mu: f64, sigma: f64, n: f64) -> (f64, OutlierEffect) {
    if !(mu > 0.0 && sigma > 0.0 && n >= 1.0 && mu.is_finite() && sigma.is_finite()) {
        return (0.0, OutlierEffect::Unaffected);
    }
    let a = n;
    let sb2 = sigma * sigma;
    let mu_a = mu / a;
    let mu_g_min = mu_a / 2.0;
    let sg = (mu_g_min / 4.0).min(sigma / a.sqrt());
    let sg2 = sg * sg;
    let var_out = |c: f64| {
        let ac = a - c;
        (ac / a) * (sb2 - ac * sg2)
    };
    let c_max = |x: f64| {
        let k = mu_a - x;
        let d = k * k;
        let ad = a * d;
        let k0 = -a * ad;
        let k1 = sb2 - a * sg2 + ad;
        let det = k1 * k1 - 4.0 * sg2 * k0;
        let c = (-2.0 * k0 / (k1 + det.sqrt())).floor();
        if c.is_finite() {
            c
        } else {
            0.0
        }
    };
    let c = c_max(0.0).min(c_max(mu_g_min));
    let v = (var_out(1.0).min(var_out(c)) / sb2).clamp(0.0, 1.0);
    let effect = if v < 0.01 {
        OutlierEffect::Unaffected
    } else if v < 0.1 {
        OutlierEffect::Slight
    } else if v < 0.5 {
        OutlierEffect::Moderate
    } else {
        OutlierEffect::Severe
    };
    (v, effect)
}

/// Summarises a set of samples (non-finite values are ignored).
pub fn summarize(xs: &[f64]) -> Summary {
    let s = sorted(xs);
    let m = mean(&s);
    let sd = std_dev(&s);
    let (ov, effect) = outlier_variance(m, sd, s.len() as f64);
    Summary {
        samples: s.len(),
        mean: m,
        std_dev: sd,
        min: s.first().copied().unwrap_or(0.0),
        max: s.last().copied().unwrap_or(0.0),
        median: percentile_sorted(&s, 50.0),
        outliers: classify_outliers(&s),
        outlier_variance: ov,
        effect,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_std_dev() {
        assert_eq!(mean(&[]), 0.0);
        assert_eq!(std_dev(&[3.0]), 0.0);
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(mean(&xs), 5.0);
        // Sample (n − 1) standard deviation: sqrt(32 / 7).
        assert!((std_dev(&xs) - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn percentiles_interpolate() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile_sorted(&s, 50.0), 3.0);
        assert_eq!(percentile_sorted(&s, 25.0), 2.0);
        assert_eq!(percentile_sorted(&[1.0, 2.0], 50.0), 1.5);
        assert_eq!(percentile_sorted(&[], 50.0), 0.0);
    }

    #[test]
    fn tukey_fences() {
        // Quartiles 10.25 and 10.75 (IQR 0.5): mild beyond 1.5 IQR,
        // severe beyond 3 IQR on either side.
        let mut xs = vec![10.0, 10.25, 10.5, 10.75, 11.0, 10.5, 10.5, 10.25, 10.75];
        xs.push(11.8); // above 10.75 + 0.75, below 10.75 + 1.5: mild
        xs.push(20.0); // severe
        xs.push(1.0); // severe, low
        let o = classify_outliers(&xs);
        assert_eq!(o.high_severe, 1, "{o:?}");
        assert_eq!(o.low_severe, 1, "{o:?}");
        assert_eq!(o.high_mild, 1, "{o:?}");
        assert_eq!(o.total(), 3);
        assert_eq!(classify_outliers(&[1.0, 2.0, 3.0]).total(), 0);
    }

    #[test]
    fn outlier_variance_grades_noise() {
        // Identical samples: nothing to explain.
        assert_eq!(
            outlier_variance(1.0, 0.0, 10.0).1,
            OutlierEffect::Unaffected
        );
        // Tiny spread around the mean: unaffected.
        let (v, e) = outlier_variance(100.0, 0.1, 100.0);
        assert!(v < 0.01, "{v}");
        assert_eq!(e, OutlierEffect::Unaffected);
        // Spread as large as the mean itself: severe.
        let (v, e) = outlier_variance(100.0, 60.0, 10.0);
        assert!(v >= 0.5, "{v}");
        assert_eq!(e, OutlierEffect::Severe);
        assert!((0.0..=1.0).contains(&v));
        // Monotone in the spread.
        let a = outlier_variance(100.0, 1.0, 20.0).0;
        let b = outlier_variance(100.0, 10.0, 20.0).0;
        assert!(a <= b, "{a} {b}");
    }

    #[test]
    fn summary_is_total() {
        let s = summarize(&[]);
        assert_eq!(
            (s.samples, s.mean, s.std_dev, s.min, s.max),
            (0, 0.0, 0.0, 0.0, 0.0)
        );
        let s = summarize(&[f64::NAN, 2.0, 1.0, 3.0]);
        assert_eq!((s.samples, s.min, s.max, s.median), (3, 1.0, 3.0, 2.0));
    }
}
