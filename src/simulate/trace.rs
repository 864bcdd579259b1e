//! Reading the openb trace CSVs (node list and pod list). Columns are found by their
//! header names, so extra or reordered columns are fine; a bad cell is an error that
//! names the file, the line and the column, and so is a number past its bound
//! (`bounds`), as are a file or a list larger than simulate reads.

use std::io::Read;
use std::path::Path;

use anyhow::Context;

use super::bounds::{MAX_GPUS, MAX_HOST, MAX_NODES, MAX_PODS, MAX_TIME, MAX_TRACE_BYTES};

/// One row of the node CSV (`sn, cpu_milli, memory_mib, gpu, model`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NodeRow {
    pub(super) name: String,
    pub(super) cpu_milli: u64,
    pub(super) memory_mib: u64,
    pub(super) gpus: u32,
    pub(super) model: String,
}

/// One row of the pod CSV (`name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PodRow {
    pub(super) name: String,
    pub(super) cpu_milli: u64,
    pub(super) memory_mib: u64,
    pub(super) num_gpu: u32,
    /// Share of one GPU in milli-GPU when `num_gpu` is 1 (1000 = whole).
    pub(super) gpu_milli: u32,
    /// Allowed GPU models (`gpu_spec` split on `|`); empty = any.
    pub(super) models: Vec<String>,
    /// When it arrived and how long it ran, in seconds, when the trace says
    /// (`creation_time`, `deletion_time`, `scheduled_time`): what `--timeline` replays.
    pub(super) life: Option<Life>,
}

/// A pod's life in the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Life {
    /// `creation_time`.
    pub(super) arrival: u64,
    /// `deletion_time` less `scheduled_time` (less `creation_time` if it never ran).
    pub(super) runtime: u64,
}

impl PodRow {
    /// The GPU the pod asks for, in milli-GPU (1000 = one GPU).
    pub(super) fn gpu_demand_milli(&self) -> u64 {
        match self.num_gpu {
            0 => 0,
            1 => u64::from(self.gpu_milli),
            k => u64::from(k) * 1000,
        }
    }
}

/// Read the node CSV at `path`.
pub(super) fn read_nodes(path: &Path) -> anyhow::Result<Vec<NodeRow>> {
    let text = read(path)?;
    parse_nodes(&path.display().to_string(), &text)
}

/// Read the pod CSV at `path`.
pub(super) fn read_pods(path: &Path) -> anyhow::Result<Vec<PodRow>> {
    let text = read(path)?;
    parse_pods(&path.display().to_string(), &text)
}

/// The file's text, if it is at most [`MAX_TRACE_BYTES`] long.
fn read(path: &Path) -> anyhow::Result<String> {
    let reading = || format!("reading {}", path.display());
    let file = std::fs::File::open(path).with_context(reading)?;
    let mut text = String::new();
    let read = file.take(MAX_TRACE_BYTES + 1).read_to_string(&mut text);
    read.with_context(reading)?;
    if text.len() as u64 > MAX_TRACE_BYTES {
        anyhow::bail!(
            "{} is larger than {} MiB, the most of a trace simulate reads",
            path.display(),
            MAX_TRACE_BYTES >> 20
        );
    }
    Ok(text)
}

/// At most `max` rows of `table`, each made by `row`; more is an error naming the file.
fn at_most<T>(
    table: &Table<'_>,
    max: usize,
    what: &str,
    row: impl Fn(&Row<'_>) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<T>> {
    let rows: Vec<T> =
        (table.rows().take(max + 1).map(|r| row(&r))).collect::<anyhow::Result<_>>()?;
    if rows.len() > max {
        anyhow::bail!(
            "{}: more than {max} {what}, the most simulate reads",
            table.file
        );
    }
    Ok(rows)
}

/// Parse node CSV text; `file` names it in errors.
fn parse_nodes(file: &str, text: &str) -> anyhow::Result<Vec<NodeRow>> {
    let columns = ["sn", "cpu_milli", "memory_mib", "gpu", "model"];
    let table = Table::new(file, text, &columns, columns.len())?;
    at_most(&table, MAX_NODES, "nodes", |row| {
        Ok(NodeRow {
            name: row.text(0).to_string(),
            cpu_milli: row.bounded(1, MAX_HOST)?,
            memory_mib: row.bounded(2, MAX_HOST)?,
            gpus: row.bounded(3, MAX_GPUS)?,
            model: row.text(4).to_string(),
        })
    })
}

/// Parse pod CSV text; `file` names it in errors.
pub(super) fn parse_pods(file: &str, text: &str) -> anyhow::Result<Vec<PodRow>> {
    let columns = [
        "name",
        "cpu_milli",
        "memory_mib",
        "num_gpu",
        "gpu_milli",
        "gpu_spec",
        "creation_time",
        "deletion_time",
        "scheduled_time",
    ];
    // `gpu_spec` is optional: some trace variants (multigpu30) leave it out; so are the
    // times, which only `--timeline` needs.
    let table = Table::new(file, text, &columns, 5)?;
    at_most(&table, MAX_PODS, "pods", pod_row)
}

fn pod_row(row: &Row<'_>) -> anyhow::Result<PodRow> {
    let num_gpu: u32 = row.bounded(3, MAX_GPUS)?;
    let gpu_milli: u32 = row.number(4)?;
    if num_gpu > 0 && !(1..=1000).contains(&gpu_milli) {
        return Err(row.error(4, "must be 1 to 1000 when num_gpu is above 0"));
    }
    if num_gpu > 1 && gpu_milli != 1000 {
        return Err(row.error(4, "must be 1000 (whole GPUs) when num_gpu is above 1"));
    }
    let models = row
        .text(5)
        .split('|')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect();
    Ok(PodRow {
        name: row.text(0).to_string(),
        cpu_milli: row.bounded(1, MAX_HOST)?,
        memory_mib: row.bounded(2, MAX_HOST)?,
        num_gpu,
        gpu_milli,
        models,
        life: life(row)?,
    })
}

/// The pod's arrival and run time; `None` when the trace has no creation or deletion time.
fn life(row: &Row<'_>) -> anyhow::Result<Option<Life>> {
    let (created, deleted) = (row.optional(6)?, row.optional(7)?);
    let (Some(arrival), Some(deleted)) = (created, deleted) else {
        return Ok(None);
    };
    let started = row.optional(8)?.unwrap_or(arrival);
    if deleted < started || started < arrival {
        return Err(row.error(7, "must not come before scheduled_time or creation_time"));
    }
    Ok(Some(Life {
        arrival,
        runtime: deleted - started,
    }))
}

/// A CSV text with the positions of the wanted columns. No quoting: the traces have none.
struct Table<'a> {
    file: &'a str,
    text: &'a str,
    names: &'a [&'a str],
    /// Where each wanted column is; `None` for an optional column the file lacks.
    positions: Vec<Option<usize>>,
}

struct Row<'a> {
    file: &'a str,
    line: usize,
    names: &'a [&'a str],
    cells: Vec<&'a str>,
}

impl<'a> Table<'a> {
    /// The first `required` of `names` must be in the header; the rest may be missing
    /// (their cells then read as empty).
    fn new(
        file: &'a str,
        text: &'a str,
        names: &'a [&'a str],
        required: usize,
    ) -> anyhow::Result<Table<'a>> {
        let header: Vec<&str> = text
            .lines()
            .next()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .collect();
        let positions = names
            .iter()
            .enumerate()
            .map(|(i, name)| match header.iter().position(|h| h == name) {
                None if i < required => Err(anyhow::anyhow!(
                    "{file} line 1: no column `{name}` in the header"
                )),
                found => Ok(found),
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Table {
            file,
            text,
            names,
            positions,
        })
    }

    /// Data rows (blank lines skipped), each with the wanted cells in `names` order.
    fn rows(&self) -> impl Iterator<Item = Row<'a>> + '_ {
        self.text
            .lines()
            .enumerate()
            .skip(1)
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(index, line)| {
                let all: Vec<&str> = line.split(',').map(str::trim).collect();
                Row {
                    file: self.file,
                    line: index + 1,
                    names: self.names,
                    cells: self
                        .positions
                        .iter()
                        .map(|p| p.and_then(|p| all.get(p).copied()).unwrap_or_default())
                        .collect(),
                }
            })
    }
}

impl Row<'_> {
    fn text(&self, column: usize) -> &str {
        self.cells[column]
    }

    fn number<T: std::str::FromStr>(&self, column: usize) -> anyhow::Result<T> {
        let cell = self.text(column);
        cell.parse()
            .map_err(|_| self.error(column, &format!("expected a whole number, found {cell:?}")))
    }

    /// A whole number no larger than `max`.
    fn bounded<T>(&self, column: usize, max: T) -> anyhow::Result<T>
    where
        T: std::str::FromStr + PartialOrd + std::fmt::Display,
    {
        let value: T = self.number(column)?;
        if value > max {
            return Err(self.error(
                column,
                &format!("{value} is more than {max}, the most simulate accepts"),
            ));
        }
        Ok(value)
    }

    /// A time in seconds (at most [`MAX_TIME`]), or `None` for an empty cell.
    fn optional(&self, column: usize) -> anyhow::Result<Option<u64>> {
        match self.text(column) {
            "" => Ok(None),
            _ => self.bounded(column, MAX_TIME).map(Some),
        }
    }

    fn error(&self, column: usize, problem: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "{} line {}, column `{}`: {problem}",
            self.file,
            self.line,
            self.names[column]
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n\
        p0,4000,8192,1,500,,LS\n\
        p1,8000,16384,2,1000,V100M16|V100M32,BE\n\
        p2,1000,1024,0,0,,LS\n";

    #[test]
    fn pods_parse_with_models_and_demands() {
        let pods = parse_pods("pods.csv", PODS).unwrap();
        assert_eq!(pods.len(), 3);
        assert_eq!(pods[0].gpu_demand_milli(), 500);
        assert_eq!(pods[1].models, vec!["V100M16", "V100M32"]);
        assert_eq!(pods[1].gpu_demand_milli(), 2000);
        assert_eq!(pods[2].gpu_demand_milli(), 0);
    }

    #[test]
    fn bad_cells_name_file_line_and_column() {
        let bad = PODS.replace("p1,8000,", "p1,lots,");
        let err = parse_pods("pods.csv", &bad).unwrap_err().to_string();
        assert_eq!(
            err,
            "pods.csv line 3, column `cpu_milli`: expected a whole number, found \"lots\""
        );
        let bad = PODS.replace("p0,4000,8192,1,500", "p0,4000,8192,1,1500");
        let err = parse_pods("pods.csv", &bad).unwrap_err().to_string();
        assert_eq!(
            err,
            "pods.csv line 2, column `gpu_milli`: must be 1 to 1000 when num_gpu is above 0"
        );
        let err = parse_nodes("nodes.csv", "sn,cpu_milli,memory_mib,gpu\n")
            .unwrap_err()
            .to_string();
        assert_eq!(err, "nodes.csv line 1: no column `model` in the header");
        let err = parse_nodes(
            "nodes.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,-2,T4\n",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "nodes.csv line 2, column `gpu`: expected a whole number, found \"-2\""
        );
    }

    /// A number past its bound names the file, the line, the column and the bound.
    #[test]
    fn numbers_past_their_bounds_are_errors_naming_the_bound() {
        let nodes = |row: &str| {
            let text = format!("sn,cpu_milli,memory_mib,gpu,model\n{row}\n");
            parse_nodes("nodes.csv", &text).unwrap_err().to_string()
        };
        assert_eq!(
            nodes("n0,64000,262144,4294967295,T4"),
            "nodes.csv line 2, column `gpu`: 4294967295 is more than 256, the most simulate accepts"
        );
        assert!(nodes("n0,64000,262144,257,T4").contains("257 is more than 256"));
        let huge = "18446744073709551615";
        assert!(
            nodes(&format!("n0,{huge},1,8,T4"))
                .contains("column `cpu_milli`: 18446744073709551615 is more than 1000000000000")
        );
        let pods = |row: &str| {
            let header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\n";
            parse_pods("pods.csv", &format!("{header}{row}\n"))
                .unwrap_err()
                .to_string()
        };
        assert!(pods("p,1,1,300,1000,,,").contains("column `num_gpu`: 300 is more than 256"));
        assert!(pods(&format!("p,1,{huge},1,1000,,,")).contains("column `memory_mib`"));
        assert!(
            pods(&format!("p,1,1,1,1000,,0,{huge}")).contains(
                "column `deletion_time`: 18446744073709551615 is more than 1000000000000"
            )
        );
    }

    #[test]
    fn a_list_longer_than_simulate_reads_is_an_error() {
        let mut text = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
        for i in 0..=MAX_NODES {
            text.push_str(&format!("n{i},1,1,1,T4\n"));
        }
        let err = parse_nodes("nodes.csv", &text).unwrap_err().to_string();
        assert_eq!(
            err,
            "nodes.csv: more than 100000 nodes, the most simulate reads"
        );
    }

    #[test]
    fn times_give_arrival_and_run_time_when_present() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time,scheduled_time\n\
            a,1,1,1,500,,100,400,160\n\
            b,1,1,1,500,,100,400,\n\
            c,1,1,1,500,,,,\n";
        let pods = parse_pods("p.csv", text).unwrap();
        let lives: Vec<Option<Life>> = pods.iter().map(|p| p.life).collect();
        let life = |arrival, runtime| Some(Life { arrival, runtime });
        assert_eq!(lives, [life(100, 240), life(100, 300), None]);
        let err = parse_pods("p.csv", &text.replace("100,400,160", "100,150,160"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "p.csv line 2, column `deletion_time`: must not come before scheduled_time or creation_time"
        );
        // The placement protocol needs no times.
        assert!(parse_pods("p.csv", PODS).unwrap()[0].life.is_none());
    }

    #[test]
    fn gpu_spec_column_may_be_missing() {
        let pods = parse_pods(
            "p.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,500\n",
        )
        .unwrap();
        assert!(pods[0].models.is_empty());
    }

    #[test]
    fn short_rows_read_missing_cells_as_empty() {
        let err = parse_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,1\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "n.csv line 2, column `memory_mib`: expected a whole number, found \"\""
        );
    }
}
