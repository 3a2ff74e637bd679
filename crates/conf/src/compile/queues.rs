//! pf's queue trees compiled for the shaper: one [`TreeSpec`] per interface, rates made
//! absolute, queue ids by name (global: `set queue std` means the queue `std` of whichever
//! interface the packet leaves by), and the checks pfctl leaves to the kernel made here, at
//! the queue's line.

use super::CompileError;
use crate::ast::{Bandwidth, Queue};
use std::collections::HashMap;
use xpf_shape::{Burst, ClassSpec, TreeSpec};

/// The queue trees of a file, and the queue ids by name (from 1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Queues {
    pub trees: Vec<TreeSpec>,
    pub ids: HashMap<String, u16>,
}

fn err(q: &Queue, msg: String) -> CompileError {
    CompileError { line: q.line, msg: format!("queue {}: {msg}", q.name) }
}

fn show(bits: u64) -> String {
    crate::print::bandwidth(Bandwidth::Bits(bits))
}

/// Compiles the queue definitions of a file.
pub fn compile(qs: &[Queue]) -> Result<Queues, CompileError> {
    let mut out = Queues::default();
    for q in qs {
        let n = out.ids.len() as u16 + 1;
        out.ids.entry(q.name.clone()).or_insert(n);
    }
    // Each root (`on IF` without a parent) makes a tree; the others hang by their parents.
    let mut iface_of: Vec<Option<String>> = vec![None; qs.len()];
    for (i, q) in qs.iter().enumerate() {
        if q.parent.is_none() {
            let Some(on) = &q.on else { return Err(err(q, "neither on an interface nor under a parent".into())) };
            if qs[..i].iter().any(|o| o.parent.is_none() && o.on.as_deref() == Some(on)) {
                return Err(err(q, format!("{on} has a root queue already")));
            }
            iface_of[i] = Some(on.clone());
        }
    }
    // Parents come first in a pf.conf (pfctl refuses a parent it has not read): each queue's
    // parent is the last queue of that name before it.
    let mut latest: HashMap<&str, usize> = HashMap::new();
    let mut parent_of: Vec<Option<usize>> = vec![None; qs.len()];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); qs.len()];
    for (i, q) in qs.iter().enumerate() {
        if let Some(p) = &q.parent {
            let Some(&pi) = latest.get(p.as_str()) else {
                return Err(err(q, format!("parent {p} is not defined before it")));
            };
            parent_of[i] = Some(pi);
            children[pi].push(i);
        }
        latest.insert(q.name.as_str(), i);
    }
    for (i, q) in qs.iter().enumerate() {
        let (Some(p), Some(pi)) = (&q.parent, parent_of[i]) else { continue };
        let on = iface_of[pi].clone();
        if let (Some(mine), Some(theirs)) = (&q.on, &on) {
            if mine != theirs {
                return Err(err(q, format!("is on {mine}, its parent {p} on {theirs}")));
            }
        }
        iface_of[i] = on;
    }
    for (i, root) in qs.iter().enumerate().filter(|(_, q)| q.parent.is_none()) {
        let ifname = iface_of[i].clone().unwrap_or_default();
        let mut classes: Vec<ClassSpec> = Vec::new();
        let mut index: HashMap<usize, usize> = HashMap::new();
        // Breadth first from the root: parents before their children.
        let mut todo = vec![i];
        while let Some(k) = todo.pop() {
            let q = &qs[k];
            let parent = parent_of[k].and_then(|pi| index.get(&pi).copied());
            let base = parent.map(|p| classes[p].bandwidth);
            let abs = |b: Option<Bandwidth>, what: &str| -> Result<u64, CompileError> {
                match (b, base) {
                    (None, _) => Ok(0),
                    (Some(Bandwidth::Bits(n)), _) => Ok(n),
                    (Some(Bandwidth::Percent(p)), Some(base)) if base > 0 => Ok(base * p as u64 / 100),
                    (Some(Bandwidth::Percent(_)), _) => Err(err(
                        q,
                        format!("{what} in percent needs a parent with a bandwidth (xpf does not take the link's speed for it)"),
                    )),
                }
            };
            let bandwidth = abs(q.bandwidth, "bandwidth")?;
            let min = abs(q.min, "min")?;
            let max = abs(q.max, "max")?;
            if q.bandwidth.is_some() && bandwidth == 0 {
                return Err(err(q, "bandwidth 0".into()));
            }
            if q.qlimit == Some(0) {
                return Err(err(q, "qlimit 0".into()));
            }
            // A burst above its rate (HFSC's concave curve) on a queue below the root: the
            // root's bandwidth is the interface's, and a burst below the rate (a delay) is
            // not what xpf's scheduler does.
            let mut burst = [Burst::default(); 3];
            for (k, (what, r)) in [("min", min), ("bandwidth", bandwidth), ("max", max)].into_iter().enumerate() {
                let Some((m, ms)) = q.burst[k] else { continue };
                let m = abs(Some(m), "burst")?;
                if parent.is_none() {
                    return Err(err(q, "burst on a root queue (its bandwidth is the interface's)".into()));
                }
                if m <= r {
                    return Err(err(q, format!("{what} burst {} not above its rate {}", show(m), show(r))));
                }
                if ms == 0 {
                    return Err(err(q, format!("{what} burst for 0ms")));
                }
                burst[k] = Burst { bits: m, ms };
            }
            index.insert(k, classes.len());
            classes.push(ClassSpec {
                name: q.name.clone(),
                qid: out.ids[&q.name],
                parent,
                bandwidth,
                min,
                max,
                qlimit: q.qlimit.unwrap_or(0),
                flows: q.flows.unwrap_or(0),
                quantum: q.quantum.unwrap_or(0),
                default: q.default,
                burst,
            });
            let kids = &children[k];
            if q.min.is_some() && !kids.is_empty() {
                return Err(err(q, "min on a queue with children (a guarantee is a leaf's)".into()));
            }
            if q.burst.iter().any(Option::is_some) && !kids.is_empty() {
                return Err(err(q, "burst on a queue with children (xpf's bursts are its leaves')".into()));
            }
            let sum: u64 = kids
                .iter()
                .map(|&c| match qs[c].bandwidth {
                    Some(Bandwidth::Bits(n)) => n,
                    Some(Bandwidth::Percent(p)) => bandwidth * p as u64 / 100,
                    None => 0,
                })
                .sum();
            if bandwidth > 0 && sum > bandwidth {
                return Err(err(
                    q,
                    format!(
                        "the sum of its children's bandwidth ({}) is higher than its own ({})",
                        show(sum),
                        show(bandwidth)
                    ),
                ));
            }
            todo.extend(kids.iter().rev());
        }
        if !classes.iter().any(|c| c.default) && classes.len() > 1 {
            return Err(err(root, format!("no default queue on {ifname}")));
        }
        out.trees.push(TreeSpec { ifname, classes });
    }
    Ok(out)
}
