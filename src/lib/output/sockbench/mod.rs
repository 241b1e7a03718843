//! sockbench's views: the text table, JSON, CSV and the SVG chart. The suites in [`crate::sockbench`] return rows; this
//! turns a [`Report`] into what the user asked for, so that the three
//! formats never disagree about what was measured.
//!
//! - [`table`](mod@table): each suite's columns in the shared text table;
//! - [`plot`]: each suite's lines on the shared SVG chart.

pub mod plot;
pub mod table;

use crate::config::sockbench::OutputArgs;
use crate::congestion::Congestion;
use crate::error::{Error, Result};
use crate::output::table::{table, Columns};
use crate::sockbench::Report;
use serde::Serialize;

/// How to print the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Csv,
}

impl Format {
    pub fn from_flags(json: bool, csv: bool) -> Result<Self> {
        match (json, csv) {
            (true, true) => Err(Error::usage("--json and --csv are exclusive: pick one")),
            (true, false) => Ok(Format::Json),
            (false, true) => Ok(Format::Csv),
            _ => Ok(Format::Table),
        }
    }
}

/// The rows as one pretty JSON document: `{"suite": ..., "rows": [...]}`
/// plus whatever `extra` adds (notes, settings).
pub fn json<R: Serialize, E: Serialize>(suite: &str, extra: &E, rows: &[R]) -> Result<String> {
    #[derive(Serialize)]
    struct Doc<'a, R, E> {
        suite: &'a str,
        #[serde(flatten)]
        extra: &'a E,
        rows: &'a [R],
    }
    serde_json::to_string_pretty(&Doc { suite, extra, rows })
        .map_err(|e| Error::runtime(format!("cannot encode JSON: {e}")))
}

/// The rows as CSV with a header line (fields must be flat).
pub fn csv<R: Serialize>(rows: &[R]) -> Result<String> {
    let mut w = ::csv::Writer::from_writer(Vec::new());
    for row in rows {
        w.serialize(row)
            .map_err(|e| Error::runtime(format!("cannot encode CSV: {e}")))?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| Error::runtime(format!("cannot encode CSV: {e}")))?;
    String::from_utf8(bytes).map_err(|e| Error::runtime(format!("cannot encode CSV: {e}")))
}

/// A suite's rows in the chosen format.
fn render<R: Serialize + Columns, E: Serialize>(
    format: Format,
    suite: &str,
    extra: &E,
    rows: &[R],
) -> Result<String> {
    Ok(match format {
        Format::Table => table(rows).render(),
        Format::Json => json(suite, extra, rows)? + "\n",
        Format::Csv => csv(rows)?,
    })
}

/// Prints a suite's rows as `out` asks, and draws its chart when `--plot`
/// was given.
pub fn print(report: &Report, out: &OutputArgs) -> Result<()> {
    let format = Format::from_flags(out.json, out.csv)?;
    let text = match report {
        Report::Udp(r) => {
            #[derive(Serialize)]
            struct Settings {
                duration_s: f64,
                warmup_s: f64,
            }
            let settings = Settings {
                duration_s: r.duration.as_secs_f64(),
                warmup_s: r.warmup.as_secs_f64(),
            };
            render(format, "udp", &settings, &r.rows)?
        }
        Report::Tcp(r) => {
            let meta = serde_json::json!({
                "samples": r.samples,
                "congestion": Congestion::effective(r.congestion),
                "congestion_is_system_default": r.congestion.is_none(),
            });
            let text = render(format, "tcp", &meta, &r.rows)?;
            if format == Format::Table {
                let algo = Congestion::effective(r.congestion).unwrap_or_else(|| "unknown".into());
                let origin = if r.congestion.is_some() {
                    "--congestion"
                } else {
                    "system default"
                };
                format!("TCP congestion control: {algo} ({origin})\n{text}")
            } else {
                text
            }
        }
        Report::Mux(r) => render(format, "mux", &serde_json::json!({}), &r.rows)?,
        Report::Ceiling(r) => {
            let meta = serde_json::json!({ "memcpy_gbps": r.memcpy_gbps });
            let text = render(format, "ceiling", &meta, &r.rows)?;
            if format == Format::Table {
                format!(
                    "memcpy, one core, 64 KiB blocks: {:.1} Gbit/s (loopback UDP copies each byte twice)\n{text}",
                    r.memcpy_gbps
                )
            } else {
                text
            }
        }
    };
    print!("{text}");
    if let Some(path) = &out.plot {
        plot::draw_report(path, report)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_has_a_header() {
        #[derive(Serialize)]
        struct R {
            a: u32,
            b: &'static str,
        }
        let text = csv(&[R { a: 1, b: "x" }]).unwrap();
        assert_eq!(text, "a,b\n1,x\n");
        assert!(Format::from_flags(true, true).is_err());
    }
}
