//! Server memory during a run.
//!
//! Two sources, either or both: `/proc/PID/status` of a local server (`--server-pid`:
//! `VmRSS` sampled every [`SAMPLE_EVERY`] and `VmHWM`, the kernel's high-water mark, read at
//! the end), and the server's Prometheus metric `process_resident_memory_bytes` (sampled
//! the same way, for servers on another host that export it). A source that cannot be read
//! gives `None`; sampling never fails a run.

use std::time::Duration;

use tokio::sync::watch;

use crate::stats::MemoryFigures;

pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// `(VmHWM, VmRSS)` in bytes from the text of `/proc/PID/status`.
pub fn parse_proc_status(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// The value of `process_resident_memory_bytes` in Prometheus text.
pub fn parse_metrics_rss(text: &str) -> Option<u64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix("process_resident_memory_bytes")
                .is_some_and(|r| r.starts_with([' ', '{']))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

fn read_proc(pid: u32) -> (Option<u64>, Option<u64>) {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|t| parse_proc_status(&t))
        .unwrap_or((None, None))
}

async fn read_metrics(client: &reqwest::Client, url: &str) -> Option<u64> {
    let resp = client.get(url).send().await.ok()?;
    parse_metrics_rss(&resp.text().await.ok()?)
}

/// Where to read memory from.
#[derive(Clone, Debug, Default)]
pub struct MemorySource {
    pub pid: Option<u32>,
    /// Full URL of the metrics endpoint.
    pub metrics_url: Option<String>,
}

impl MemorySource {
    async fn sample(&self, client: &reqwest::Client, fig: &mut MemoryFigures) {
        let mut rss = None;
        if let Some(pid) = self.pid {
            let (hwm, r) = read_proc(pid);
            rss = r;
            fig.peak_hwm_bytes = hwm.max(fig.peak_hwm_bytes);
        }
        if rss.is_none()
            && let Some(url) = &self.metrics_url
        {
            rss = read_metrics(client, url).await;
        }
        fig.max_rss_bytes = rss.max(fig.max_rss_bytes);
    }

    /// Samples until `stop` changes (or its sender is dropped), then once more.
    pub async fn watch(
        self,
        client: reqwest::Client,
        mut stop: watch::Receiver<bool>,
    ) -> MemoryFigures {
        let mut fig = MemoryFigures::default();
        if self.pid.is_none() && self.metrics_url.is_none() {
            return fig;
        }
        loop {
            self.sample(&client, &mut fig).await;
            tokio::select! {
                _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                _ = stop.changed() => break,
            }
        }
        self.sample(&client, &mut fig).await;
        fig
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_status_fields() {
        let text =
            "Name:\ttokenmill\nVmPeak:\t  900 kB\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\n";
        assert_eq!(parse_proc_status(text), (Some(2 << 20), Some(1 << 20)));
        assert_eq!(parse_proc_status("Name: x\n"), (None, None));
        assert_eq!(parse_proc_status("VmRSS: lots kB\n"), (None, None));
    }

    #[test]
    fn metrics_rss() {
        let text = "# HELP x\nprocess_resident_memory_bytes_total 5\nprocess_resident_memory_bytes 1.5e6\n";
        assert_eq!(parse_metrics_rss(text), Some(1_500_000));
        assert_eq!(parse_metrics_rss("vllm:x 1\n"), None);
    }

    #[tokio::test]
    async fn samples_this_process() {
        let src = MemorySource {
            pid: Some(std::process::id()),
            metrics_url: None,
        };
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(src.watch(reqwest::Client::new(), rx));
        tx.send(true).unwrap();
        let fig = task.await.unwrap();
        let (hwm, rss) = (fig.peak_hwm_bytes.unwrap(), fig.max_rss_bytes.unwrap());
        assert!(rss > 0 && hwm >= rss, "hwm {hwm} rss {rss}");
    }
}
