//! The latency summary pte_runner prints.

use std::time::Duration;

#[derive(Debug, PartialEq)]
pub struct Summary {
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
    pub min: f64,
    pub avg: f64,
    pub max: f64,
}

/// Milliseconds; percentiles by nearest rank. `times` must not be empty.
pub fn summarize(times: &[Duration]) -> Summary {
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| ms[(((p / 100.0) * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
    Summary {
        p10: pct(10.0),
        p50: pct(50.0),
        p90: pct(90.0),
        min: ms[0],
        avg: ms.iter().sum::<f64>() / ms.len() as f64,
        max: ms[ms.len() - 1],
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            // Tenths of a microsecond: small delegated calls take a few µs.
            "p10 {:.4} ms, p50 {:.4} ms, p90 {:.4} ms, min {:.4} ms, avg {:.4} ms, max {:.4} ms",
            self.p10, self.p50, self.p90, self.min, self.avg, self.max
        )
    }
}

/// The process's peak resident memory in KiB (Linux `VmHWM`), if the
/// platform reports it.
pub fn peak_rss_kib() -> Option<u64> {
    status_kib("VmHWM:")
}

/// Resets the peak to the current resident memory (Linux `clear_refs`) and
/// returns that, the baseline later peaks are measured from. None where the
/// platform cannot, in which case peaks are absolute.
pub fn reset_peak_rss() -> Option<u64> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    status_kib("VmRSS:")
}

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let times: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        let s = summarize(&times);
        assert_eq!((s.p10, s.p50, s.p90), (1.0, 5.0, 9.0));
        assert_eq!((s.min, s.max), (1.0, 10.0));
        assert!((s.avg - 5.5).abs() < 1e-12);
        let one = summarize(&[Duration::from_micros(1500)]);
        assert_eq!((one.p10, one.p90), (1.5, 1.5));
        let fast = summarize(&[Duration::from_nanos(4_130)]);
        assert!(fast.to_string().starts_with("p10 0.0041 ms, p50 0.0041 ms"));
    }

    #[test]
    fn peak_memory_grows_with_a_large_allocation() {
        let before = reset_peak_rss().expect("clear_refs on Linux");
        assert!(peak_rss_kib().unwrap() <= before + 1024);
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        assert!(peak_rss_kib().unwrap() >= before + 60 * 1024);
    }
}
