//! What hardware the defaults pick: the thread count (the cores this process may use) and,
//! for `--backend auto`, a GPU adapter that is real hardware.

use std::collections::HashSet;

use ternion::backend::gpu::{list_adapters, GpuOptions};

/// The cores this process may use: `available_parallelism` (CPU affinity and cgroup
/// quota), and no more than the physical cores when `/proc/cpuinfo` lists them (a second
/// hardware thread of a core adds little to the memory-bound matrix-vector work).
pub fn usable() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let physical = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| physical_cores(&s));
    physical.map_or(logical, |p| p.min(logical))
}

/// Distinct (`physical id`, `core id`) pairs of a `/proc/cpuinfo` text; `None` when it
/// names none (some ARM kernels, containers that hide them).
fn physical_cores(cpuinfo: &str) -> Option<usize> {
    let mut seen = HashSet::new();
    let mut package = None;
    for line in cpuinfo.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "processor" => package = None,
            "physical id" => package = Some(value.trim().to_owned()),
            "core id" => {
                seen.insert((package.clone(), value.trim().to_owned()));
            }
            _ => {}
        }
    }
    (!seen.is_empty()).then_some(seen.len())
}

/// The adapter `--backend auto` opens: the best one that is not a CPU-type adapter
/// (discrete, then integrated, then virtual, then other), as its `--device` index; the
/// reason when there is none.
pub fn best_hardware_adapter() -> Result<usize, String> {
    let adapters = list_adapters(GpuOptions::default().backends);
    let rank = |t: &str| match t {
        "DiscreteGpu" => 0,
        "IntegratedGpu" => 1,
        "VirtualGpu" => 2,
        _ => 3,
    };
    let best = adapters
        .iter()
        .filter(|a| a.device_type != "Cpu")
        .min_by_key(|a| rank(&a.device_type));
    match best {
        Some(a) => Ok(a.index),
        None if adapters.is_empty() => Err("no GPU adapter found".into()),
        None => {
            let names: Vec<&str> = adapters.iter().map(|a| a.name.as_str()).collect();
            Err(format!(
                "only CPU-type GPU adapters found ({}), slower than the CPU backend",
                names.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_cores_not_hardware_threads() {
        let two_cores_four_threads = "processor\t: 0\nphysical id\t: 0\ncore id\t\t: 0\n\n\
            processor\t: 1\nphysical id\t: 0\ncore id\t\t: 1\n\n\
            processor\t: 2\nphysical id\t: 0\ncore id\t\t: 0\n\n\
            processor\t: 3\nphysical id\t: 0\ncore id\t\t: 1\n";
        assert_eq!(physical_cores(two_cores_four_threads), Some(2));
        let two_packages = "processor : 0\nphysical id : 0\ncore id : 0\n\
            processor : 1\nphysical id : 1\ncore id : 0\n";
        assert_eq!(physical_cores(two_packages), Some(2));
        assert_eq!(physical_cores("processor : 0\nBogoMIPS : 50\n"), None);
    }
}
