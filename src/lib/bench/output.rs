//! The three views of a suite's rows: an aligned text table for people,
//! and JSON and CSV for programs. Each suite turns its rows into a
//! [`Table`] (for text) and serialises the same row structs for JSON and
//! CSV, so the three never disagree about what was measured.

use crate::error::{Error, Result};
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

/// A text table: a header row and rows of already-formatted cells.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    /// Columns padded to their widest cell; cells that look like numbers
    /// are right-aligned so that digits line up.
    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        // A column whose cells are all numbers is right-aligned, header too.
        let numeric: Vec<bool> = (0..cols)
            .map(|i| {
                !self.rows.is_empty()
                    && self
                        .rows
                        .iter()
                        .all(|r| r.get(i).is_some_and(|c| looks_numeric(c) || c == "-"))
            })
            .collect();
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = cells.get(i).map(String::as_str).unwrap_or("");
                if i > 0 {
                    out.push_str("  ");
                }
                if numeric[i] || looks_numeric(cell) {
                    out.push_str(&format!("{cell:>w$}"));
                } else {
                    out.push_str(&format!("{cell:<w$}"));
                }
            }
            out.trim_end().to_string()
        };
        let mut out = line(&self.headers);
        out.push('\n');
        let total: usize = widths.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }
}

fn looks_numeric(cell: &str) -> bool {
    let c = cell.trim_end_matches('%');
    !c.is_empty() && c.parse::<f64>().is_ok()
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

/// Mbit/s with two decimals.
pub fn mbit(bits_per_second: f64) -> String {
    format!("{:.2}", bits_per_second / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_numbers_right() {
        let mut t = Table::new(&["name", "rate"]);
        t.push(vec!["std".into(), "1.5".into()]);
        t.push(vec!["socket2".into(), "100.25".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "name       rate");
        assert_eq!(lines[2], "std         1.5");
        assert_eq!(lines[3], "socket2  100.25");
    }

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
