//! The SVG of `--plot`: allocated GPU % against arrived GPU demand %, one curve per
//! policy and `--max-moves` (its first seed).

use std::path::Path;

use plotters::prelude::*;

use super::PolicyReport;

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Write the plot of `reports` to `path`.
pub(super) fn write(path: &Path, reports: &[PolicyReport]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (800, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("GPU allocated vs. GPU demand arrived", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(54)
        .build_cartesian_2d(0f64..130f64, 0f64..100f64)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("arrived GPU demand (% of capacity)")
        .y_desc("GPU allocated (% of capacity)")
        .draw()
        .map_err(plot_error)?;
    for (i, report) in reports.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let Some(run) = report.runs.first() else {
            continue;
        };
        let defrag = report
            .max_moves
            .map_or(String::new(), |k| format!(", defrag ≤ {k} moves"));
        let label = format!("{}{defrag} ({:.2}%)", report.policy, run.allocated_pct());
        chart
            .draw_series(LineSeries::new(
                run.curve.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(plot_error)?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

fn plot_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{error}")
}
