//! Two SVG figures from an invocation's throughput runs: cycles/s by client
//! count and cycle p99 by client count, one line per system (system, node
//! count, TLS), both axes logarithmic. Runs behind a backlog are left
//! out: they answer another question (their own table). `scripts/bench`
//! writes the figures next to docs/benchmarks.md when it rewrites it.

use std::collections::BTreeMap;

use plotters::prelude::*;

use crate::measure::RunSummary;
use crate::report::label;

/// Width and height of each figure, pixels.
const SIZE: (u32, u32) = (960, 520);
/// Width of the legend's column, pixels.
const LEGEND_WIDTH: u32 = 180;

/// Line colours, in series order (the tab10 palette: distinct, and none
/// too pale on white).
const COLORS: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// One line of a figure: its legend and its runs by client count.
type Series<'a> = (String, Vec<&'a RunSummary>);

/// The two figures, as SVG text: (cycles/s, cycle p99).
pub fn figures(runs: &[RunSummary]) -> anyhow::Result<(String, String)> {
    let shown = crate::repeats::medians(runs);
    let series = series(&shown);
    anyhow::ensure!(!series.is_empty(), "no throughput runs to plot");
    let throughput =
        draw("Cycles per second by client count", "cycles/s", &series, |run| run.cycles_per_s)?;
    let p99 = draw("Cycle p99 by client count", "cycle p99 (ms)", &series, |run| {
        run.cycle.p99_us as f64 / 1000.0
    })?;
    Ok((throughput, p99))
}

/// The runs without a backlog (each row's median run: `repeats`), grouped by
/// system, nodes and TLS, each group's runs by client count.
fn series(runs: &[RunSummary]) -> Vec<Series<'_>> {
    let mut groups: BTreeMap<(usize, u8, bool), BTreeMap<usize, &RunSummary>> = BTreeMap::new();
    for run in runs.iter().filter(|run| run.backlog == 0) {
        groups.entry((run.nodes, run.system as u8, run.tls)).or_default().insert(run.clients, run);
    }
    groups
        .into_values()
        .filter_map(|by_clients| {
            let first = by_clients.values().next()?;
            let name = label(first.system, first.nodes, first.tls);
            Some((name, by_clients.into_values().collect()))
        })
        .collect()
}

/// One figure: `value` of each run against its client count.
fn draw(
    title: &str,
    y_label: &str,
    series: &[Series<'_>],
    value: fn(&RunSummary) -> f64,
) -> anyhow::Result<String> {
    let all = || series.iter().flat_map(|(_, runs)| runs.iter());
    let max_clients = all().map(|run| run.clients).max().unwrap_or(1) as f64;
    let max_value = all().map(|run| value(run)).fold(0.0, f64::max).max(1.0);
    // Both axes logarithmic: a ratio between two systems is the same
    // distance wherever it sits, as the report's ratios read.
    let min_value =
        all().map(|run| value(run)).filter(|v| *v > 0.0).fold(max_value, f64::min).min(max_value);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        // The legend gets its own column on the right, so it never hides
        // a line.
        let (plot_area, legend_area) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (0.8..(max_clients * 1.25).max(2.0)).log_scale(),
                (min_value * 0.7..max_value * 1.5).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("clients (log scale)")
            .y_desc(format!("{y_label} (log scale)"))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| {
                if *y >= 10.0 { format!("{y:.0}") } else { format!("{y:.1}") }
            })
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .draw()?;
        for (number, (name, runs)) in series.iter().enumerate() {
            let color = COLORS[number % COLORS.len()];
            let points: Vec<(f64, f64)> = runs
                .iter()
                .map(|run| (run.clients as f64, value(run)))
                .filter(|(_, v)| *v > 0.0)
                .collect();
            chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
            let y = 60 + 22 * i32::try_from(number).unwrap_or(0);
            legend_area.draw(&PathElement::new(vec![(4, y), (28, y)], color.stroke_width(3)))?;
            legend_area.draw(&Text::new(
                name.clone(),
                (34, y - 7),
                ("sans-serif", 14).into_font().color(&BLACK),
            ))?;
            chart.draw_series(
                points.into_iter().map(|point| Circle::new(point, 3, color.filled())),
            )?;
        }
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    //! The figures for hand-made rows: both are SVG documents naming every
    //! system's line in their legends, and a backlog run adds no line.

    use super::*;
    use crate::System;
    use crate::measure::Latency;

    fn run(system: System, nodes: usize, clients: usize, cycles_per_s: f64) -> RunSummary {
        let latency = Latency { count: 10, p50_us: 5_000, p99_us: 9_000, ..Latency::default() };
        RunSummary::sample(system, nodes, clients, cycles_per_s, latency)
    }

    #[test]
    fn every_system_has_a_line_in_both_figures() -> anyhow::Result<()> {
        let mut runs = Vec::new();
        for clients in [1, 32, 128] {
            let c = clients as f64;
            runs.push(run(System::Leasehold, 3, clients, 100.0 * c));
            runs.push(run(System::Etcd, 3, clients, 10.0 * c));
            runs.push(run(System::EtcdCas, 3, clients, 20.0 * c));
            runs.push(run(System::Postgres, 3, clients, 50.0 * c));
        }
        let backlog = RunSummary { backlog: 1_000, ..run(System::Postgres, 1, 8, 1.0) };
        runs.push(backlog);
        let (throughput, p99) = figures(&runs)?;
        for svg in [&throughput, &p99] {
            assert!(svg.starts_with("<svg"), "{svg}");
            for name in ["leasehold ×3", "etcd ×3", "etcd-cas ×3", "postgres ×3"] {
                assert!(svg.contains(name), "{name} missing from {svg}");
            }
            assert!(!svg.contains("postgres ×1"), "a backlog run got a line: {svg}");
        }
        assert!(throughput.contains("cycles/s"), "{throughput}");
        assert!(p99.contains("cycle p99"), "{p99}");
        Ok(())
    }

    #[test]
    fn no_runs_no_figure() {
        assert!(figures(&[]).is_err());
    }
}
