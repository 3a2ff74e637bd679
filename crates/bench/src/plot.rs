//! gnuplot data in the seed's form (`#index median minimum maximum`) and a PNG drawn by
//! gnuplot when it is installed (`make` installs it).

use std::io::Write;
use std::path::Path;
use std::process::Command;

pub struct Series<'a> {
    pub title: &'a str,
    /// (x, median, min, max)
    pub points: Vec<(f64, f64, f64, f64)>,
}

/// Writes `<dir>/gnuplot.data` (one block per series, separated by two blank lines as gnuplot's
/// `index` wants), `<dir>/plot.gp`, and runs gnuplot for `<dir>/<name>.png`. Returns the PNG's
/// path, or a note saying why there is none.
pub fn write(
    dir: &Path,
    name: &str,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    logx: bool,
    series: &[Series],
) -> std::io::Result<Result<String, String>> {
    std::fs::create_dir_all(dir)?;
    let data = dir.join("gnuplot.data");
    let mut f = std::fs::File::create(&data)?;
    for (i, s) in series.iter().enumerate() {
        writeln!(f, "# {}", s.title)?;
        writeln!(f, "#index median minimum maximum")?;
        for p in &s.points {
            writeln!(f, "{} {:.0} {:.0} {:.0}", p.0, p.1, p.2, p.3)?;
        }
        if i + 1 < series.len() {
            writeln!(f, "\n")?;
        }
    }
    let png = dir.join(format!("{name}.png"));
    let mut gp = String::new();
    gp.push_str("set terminal png size 1000,600\n");
    gp.push_str(&format!("set output '{}'\n", png.display()));
    gp.push_str(&format!("set title '{title}'\nset xlabel '{xlabel}'\nset ylabel '{ylabel}'\n"));
    if logx {
        gp.push_str("set logscale x\n");
    }
    gp.push_str("set grid\nset key outside bottom center horizontal\nset yrange [0:*]\nset format y '%.0s%c'\n");
    let plots: Vec<String> = series
        .iter()
        .enumerate()
        .map(|(i, s)| format!("'{}' index {i} using 1:2:3:4 with yerrorlines title '{}'", data.display(), s.title))
        .collect();
    gp.push_str(&format!("plot {}\n", plots.join(", ")));
    std::fs::write(dir.join("plot.gp"), &gp)?;
    match Command::new("gnuplot").arg(dir.join("plot.gp")).output() {
        Ok(o) if o.status.success() => Ok(Ok(png.display().to_string())),
        Ok(o) => Ok(Err(format!("gnuplot failed: {}", String::from_utf8_lossy(&o.stderr).trim()))),
        Err(_) => Ok(Err("gnuplot is not installed (make installs gnuplot-nox); data and script are written".into())),
    }
}

/// A bar chart: one bar per `(label, value, min, max)` with an error bar from min to max,
/// and a line at 1 (the baseline). Writes `<dir>/<name>.data`, `<dir>/<name>.gp` and runs
/// gnuplot for `<dir>/<name>.png`; returns as `write` does.
pub fn bars(
    dir: &Path,
    name: &str,
    title: &str,
    ylabel: &str,
    bars: &[(String, f64, f64, f64)],
) -> std::io::Result<Result<String, String>> {
    std::fs::create_dir_all(dir)?;
    let data = dir.join(format!("{name}.data"));
    let mut f = std::fs::File::create(&data)?;
    writeln!(f, "#label value minimum maximum")?;
    for (l, v, lo, hi) in bars {
        writeln!(f, "\"{l}\" {v:.4} {lo:.4} {hi:.4}")?;
    }
    let png = dir.join(format!("{name}.png"));
    let gp = format!(
        "set terminal png size 1000,600\nset output '{}'\nset title '{title}'\nset ylabel '{ylabel}'\n\
         set style data histograms\nset style histogram errorbars gap 2 lw 1\nset style fill solid 0.5 border -1\n\
         set logscale y\nset grid y\nset key off\nset xtics rotate by -20\n\
         plot '{}' using 2:3:4:xtic(1), 1 with lines lt 0\n",
        png.display(),
        data.display()
    );
    let script = dir.join(format!("{name}.gp"));
    std::fs::write(&script, gp)?;
    match Command::new("gnuplot").arg(&script).output() {
        Ok(o) if o.status.success() => Ok(Ok(png.display().to_string())),
        Ok(o) => Ok(Err(format!("gnuplot failed: {}", String::from_utf8_lossy(&o.stderr).trim()))),
        Err(_) => Ok(Err("gnuplot is not installed (make installs gnuplot-nox); data and script are written".into())),
    }
}
