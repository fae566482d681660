//! Drawing one chart of the HTML report with plotters' SVG backend: lines
//! over the run's time axis, the fault window shaded behind them, a
//! legend. Only the data lines are `<polyline>`s of width 2 (the axes'
//! are of width 1, the legend's samples are rectangles). The root `<svg>`
//! is tagged with the chart's id, the class
//! `chart` and `data-points` / `data-series` (how many records and lines
//! it shows), so a page check can tell a chart with data from an empty one.

use anyhow::anyhow;
use plotters::prelude::*;

use super::series::{Axis, Series};

/// The size of one chart, px.
const SIZE: (u32, u32) = (1100, 310);

/// The colours of a chart's lines, in order (then again).
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
/// The fault window's shade.
const FAULT_SHADE: RGBColor = RGBColor(255, 205, 205);

/// One chart to draw.
pub struct Chart<'a> {
    /// The root `<svg>`'s id.
    pub id: &'a str,
    /// Its caption.
    pub title: &'a str,
    /// The y axis's label.
    pub y_label: &'a str,
    /// Its lines.
    pub series: &'a [Series],
    /// How many records the lines show (`data-points`).
    pub records: usize,
    /// The time axis.
    pub axis: Axis,
    /// The fault window to shade, ms after "go".
    pub fault_window: Option<[f64; 2]>,
    /// Mark every point with a dot too: for lines of few points (a herd's
    /// answers bunch up in a bucket or two), which a line alone hides.
    pub dots: bool,
}

/// Draws `chart` as one `<svg>` element.
pub fn draw(chart: &Chart<'_>) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let failed = |e: &dyn std::fmt::Display| anyhow!("drawing the chart {}: {e}", chart.id);
        root.fill(&WHITE).map_err(|e| failed(&e))?;
        let y_max = chart
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max)
            .max(1.0)
            // Headroom for the legend, upper left: a herd's answers come
            // at the end of the run, high on the right.
            * 1.3;
        let mut plot = ChartBuilder::on(&root)
            .caption(chart.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..chart.axis.end_ms, 0.0..y_max)
            .map_err(|e| failed(&e))?;
        plot.configure_mesh()
            .x_desc("ms after the start")
            .y_desc(chart.y_label)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| {
                if y_max < 10.0 {
                    format!("{v:.1}")
                } else {
                    format!("{v:.0}")
                }
            })
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| failed(&e))?;
        if let Some([from, to]) = chart.fault_window {
            plot.draw_series(std::iter::once(Rectangle::new(
                [(from, 0.0), (to.max(from), y_max)],
                FAULT_SHADE.mix(0.6).filled(),
            )))
            .map_err(|e| failed(&e))?
            .label("fault window")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], FAULT_SHADE.filled()));
        }
        for (i, s) in chart.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            plot.draw_series(LineSeries::new(
                s.points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(|e| failed(&e))?
            .label(s.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 2), (x + 16, y + 2)], colour.filled()));
            if chart.dots {
                plot.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
                    .map_err(|e| failed(&e))?;
            }
        }
        plot.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(|e| failed(&e))?;
        root.present().map_err(|e| failed(&e))?;
    }
    let tag = format!(
        "<svg id=\"{}\" class=\"chart\" data-points=\"{}\" data-series=\"{}\"",
        chart.id,
        chart.records,
        chart.series.len()
    );
    match svg.strip_prefix("<svg") {
        Some(rest) => Ok(format!("{tag}{rest}")),
        None => Err(anyhow!("the chart {} is not an <svg> element", chart.id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_is_one_tagged_svg_with_its_lines_and_the_fault_shaded() {
        let series = [Series {
            name: "loaded <&>".to_owned(),
            points: vec![(0.0, 0.0), (100.0, 3.0), (200.0, 1.0)],
        }];
        let svg = draw(&Chart {
            id: "answers",
            title: "Answers",
            y_label: "answers",
            series: &series,
            records: 4,
            axis: Axis {
                end_ms: 300.0,
                bucket_ms: 10.0,
            },
            fault_window: Some([50.0, 150.0]),
            dots: true,
        })
        .expect("draws");
        assert!(
            svg.starts_with(
                "<svg id=\"answers\" class=\"chart\" data-points=\"4\" data-series=\"1\" width="
            ),
            "{svg}"
        );
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<svg").count(), 1);
        let lines: Vec<&str> = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"2\""))
            .collect();
        assert_eq!(lines.len(), 1, "the one data line: {svg}");
        assert!(lines[0].contains("stroke=\"#1F77B4\""), "{}", lines[0]);
        assert_eq!(svg.matches("<circle").count(), 3, "a dot per point");
        assert!(svg.contains("loaded &lt;&amp;&gt;"), "escaped legend");
        assert!(svg.contains("fault window"));
        assert!(svg.contains("fill=\"#FFCDCD\""), "the shade: {svg}");
    }
}
