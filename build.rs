//! Tells the tests which SIMD tiers the build machine has, so a tier test the CPU cannot run is compiled as
//! ignored with its reason (`cargo test` lists it by name) rather than passing without checking anything.
//! Only for native builds: the tests run where they are built.

//!
//! Likewise for the catalog models beyond the test model that some tests need: `REAGENT_TEST_MODELS`
//! (`all`, or names separated by commas, as `.ci/run` sets it) at build time turns those tests on; without
//! it they are compiled as ignored, saying which model they need.

/// Catalog models the tests may need, with the cfg that turns their tests on.
const TEST_MODELS: [(&str, &str); 3] = [
    ("reagent_test_qwen", "qwen2.5-coder-0.5b"),
    ("reagent_test_qwen15", "qwen2.5-coder-1.5b"),
    ("reagent_test_gemma", "gemma3-270m"),
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=REAGENT_TEST_MODELS");
    let wanted = std::env::var("REAGENT_TEST_MODELS").unwrap_or_default();
    for (cfg, name) in TEST_MODELS {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if wanted.split(',').any(|w| w.trim() == name || w.trim() == "all") {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
    for cfg in ["reagent_host_avx2", "reagent_host_avxvnni", "reagent_host_avx512", "reagent_host_amx"] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    if std::env::var("TARGET").ok() == std::env::var("HOST").ok() {
        host_features();
    }
}

#[cfg(target_arch = "x86_64")]
fn host_features() {
    let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
    let flags = [
        ("reagent_host_avx2", avx2),
        ("reagent_host_avxvnni", avx2 && is_x86_feature_detected!("avxvnni")),
        (
            "reagent_host_avx512",
            avx2 && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni"),
        ),
        // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE (Linux must still grant the tile state).
        ("reagent_host_amx", {
            let leaf = std::arch::x86_64::__cpuid_count(7, 0);
            leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0
        }),
    ];
    for (cfg, present) in flags {
        if present {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn host_features() {}
