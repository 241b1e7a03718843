//! The aligned text table: sockbench's suites, `udp_client
//! --sweep-clients` and tcp_proxy's benchmark print through it.
//!
//! Why one renderer: a caller only says which columns it has and how a
//! row fills them ([`Columns`]); widths, alignment and the rule under the
//! header are decided once, in [`Table::render`].

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

/// A row type's columns: the header and one row's cells.
pub trait Columns {
    const HEADERS: &'static [&'static str];
    fn cells(&self) -> Vec<String>;
}

/// The rows as a table.
pub fn table<R: Columns>(rows: &[R]) -> Table {
    let mut t = Table::new(R::HEADERS);
    for r in rows {
        t.push(r.cells());
    }
    t
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
}
