//! The `build.rs` entry point.
use crate::check::{check_code_object, check_ptx, Stats};
use crate::compile::{hash_dir, write_device_crate, write_if_changed, Artifact, CompileJob, Target};
use crate::error::IoContext;
use crate::{sysroot, toolchain, BuildError};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A PTX variant: its target and the kernels launched from it, always (`required`) or
/// where it runs (`preferred`).
#[derive(Clone, Debug)]
struct Variant {
    sm: String,
    required: Vec<String>,
    preferred: Vec<String>,
}

/// Configures and runs the kernel build of one crate.
#[derive(Clone, Debug)]
pub struct KernelBuild {
    modules: Vec<String>,
    archs: Vec<String>,
    ptx: Option<String>,
    ptx_variants: Vec<Variant>,
}

/// What a build produced.
#[derive(Clone, Debug)]
pub struct BuildReport {
    /// Artifacts per target.
    pub artifacts: Vec<Artifact>,
    /// Per kernel and architecture figures.
    pub stats: Vec<Stats>,
    /// How `core` was obtained (`rust-src` / `rust-docs`).
    pub core_origin: &'static str,
    /// The rustc used.
    pub rustc: String,
}

fn env(name: &str) -> Option<String> {
    println!("cargo:rerun-if-env-changed={name}");
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Default for KernelBuild {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelBuild {
    /// A build with the default architectures ([`crate::DEFAULT_ARCHS`]) and PTX, unless
    /// overridden by `KERNEL_ARCHS` / `KERNEL_PTX` / `KERNEL_PTX_ARCH`.
    pub fn new() -> Self {
        KernelBuild {
            modules: Vec::new(),
            archs: crate::DEFAULT_ARCHS.iter().map(|s| s.to_string()).collect(),
            ptx: Some(crate::DEFAULT_PTX_ARCH.to_string()),
            ptx_variants: Vec::new(),
        }
    }

    /// Adds the kernel module `src/<name>.rs` (mirrored at `crate::<name>` on the host).
    pub fn module(mut self, name: &str) -> Self {
        self.modules.push(name.to_string());
        self
    }

    /// Sets the AMD architectures (`KERNEL_ARCHS` still wins).
    pub fn archs(mut self, archs: &[&str]) -> Self {
        self.archs = archs.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Sets the PTX target, or `None` for no PTX (`KERNEL_PTX=0` wins).
    pub fn ptx(mut self, sm: Option<&str>) -> Self {
        self.ptx = sm.map(str::to_string);
        self
    }

    /// Also builds PTX for `sm` (e.g. `sm_90a`, for instructions the main PTX target lacks)
    /// whenever PTX is built; the CUDA runtime launches the kernels named in `kernels`
    /// (base names: `gemm_wgmma` covers `gemm_wgmma_bf16`, ..) from it on devices of that
    /// architecture. The whole crate compiles for it, so its entry list is checked as the
    /// main PTX's is.
    pub fn ptx_variant(mut self, sm: &str, kernels: &[&str]) -> Self {
        self.variant(sm).required.extend(kernels.iter().map(|k| k.to_string()));
        self
    }

    /// Like [`KernelBuild::ptx_variant`] for kernels that also have a main-PTX version:
    /// the CUDA runtime launches `kernels` (exact names) from the `sm` variant on devices of
    /// that architecture and from the main PTX elsewhere (for instructions that only make
    /// a kernel faster there, such as `griddepcontrol`).
    pub fn ptx_variant_preferred(mut self, sm: &str, kernels: &[&str]) -> Self {
        self.variant(sm).preferred.extend(kernels.iter().map(|k| k.to_string()));
        self
    }

    fn variant(&mut self, sm: &str) -> &mut Variant {
        match self.ptx_variants.iter().position(|v| v.sm == sm) {
            Some(i) => &mut self.ptx_variants[i],
            None => {
                self.ptx_variants.push(Variant { sm: sm.to_string(), required: Vec::new(), preferred: Vec::new() });
                self.ptx_variants.last_mut().unwrap()
            }
        }
    }

    /// Runs the build; on error prints the reason and fails the build script.
    pub fn build(self) {
        match self.try_build() {
            Ok(report) => {
                let built: Vec<_> = report.artifacts.iter().filter(|a| a.compiled).map(|a| a.target.cpu().to_string()).collect();
                if !built.is_empty() {
                    println!("cargo:warning=kernels compiled for {} ({}, core from {})", built.join(", "), report.rustc, report.core_origin);
                }
            }
            Err(e) => {
                eprintln!("\nerror: GPU kernel build failed\n\n{e}\n");
                eprintln!("(set KERNEL_SKIP_GPU_BUILD=1 to build for the CPU executor only)");
                std::process::exit(1);
            }
        }
    }

    /// Runs the build.
    pub fn try_build(self) -> Result<BuildReport, BuildError> {
        let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run from build.rs"));
        let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("run from build.rs"));
        let crate_name = std::env::var("CARGO_PKG_NAME").unwrap_or_default();
        println!("cargo:rerun-if-changed=build.rs");
        let modules: Vec<(String, PathBuf)> =
            self.modules.iter().map(|m| (m.clone(), manifest.join("src").join(format!("{m}.rs")))).collect();
        for (_, p) in &modules {
            println!("cargo:rerun-if-changed={}", p.display());
        }
        let kernel_dsl = kernel_dsl_src();
        println!("cargo:rerun-if-changed={}", kernel_dsl.parent().unwrap().display());
        let archs: Vec<String> = match env("KERNEL_ARCHS") {
            // `none`: no AMD code objects (PTX only), e.g. for binaries that travel to an
            // NVIDIA machine.
            Some(list) if list == "none" => vec![],
            Some(list) => list.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
            None => self.archs.clone(),
        };
        let ptx = match env("KERNEL_PTX").as_deref() {
            Some("0") | Some("off") | Some("false") => None,
            _ => env("KERNEL_PTX_ARCH").or(self.ptx.clone()),
        };
        let binaries = out_dir.join("kernel_binaries.rs");
        if env("KERNEL_SKIP_GPU_BUILD").is_some_and(|v| v != "0") {
            println!("cargo:warning=KERNEL_SKIP_GPU_BUILD is set: no GPU code built for {crate_name}; only the CPU executor can run its kernels");
            write_if_changed(&binaries, embedded(&crate_name, &[], &[], ptx.as_deref(), &[]).as_bytes())?;
            return Ok(BuildReport { artifacts: vec![], stats: vec![], core_origin: "none", rustc: "none".into() });
        }
        for a in &archs {
            crate::compile::amdgpu_gen(a)?;
        }

        let started = Instant::now();
        let rustc = toolchain::find()?;
        let cache = cache_dir(&out_dir);
        let core = sysroot::core_source(&rustc, &cache)?;
        let device = write_device_crate(&modules, &out_dir)?;
        let dsl_hash = hash_dir(kernel_dsl.parent().unwrap())?;

        let mut targets: Vec<Target> = archs.iter().map(|a| Target::Amdgpu(a.clone())).collect();
        // Variants other than the main PTX target, built whenever PTX is.
        let variants: Vec<Variant> = match &ptx {
            Some(main) => self.ptx_variants.iter().filter(|v| &v.sm != main).cloned().collect(),
            None => vec![],
        };
        if let Some(sm) = &ptx {
            targets.push(Target::Nvptx(sm.clone()));
        }
        for v in &variants {
            targets.push(Target::Nvptx(v.sm.clone()));
        }
        let results: Vec<Result<Artifact, BuildError>> = std::thread::scope(|s| {
            let handles: Vec<_> = targets
                .iter()
                .map(|t| {
                    let (rustc, core, cache, device, out_dir, kernel_dsl) = (&rustc, &core, &cache, &device, &out_dir, &kernel_dsl);
                    let artifact_cache = cache.join(rustc.version_key()).join("kernels");
                    s.spawn(move || {
                        let root = sysroot::ensure(rustc, core, cache, t.triple(), t.cpu())?;
                        CompileJob {
                            rustc,
                            sysroot: &root,
                            kernel_dsl,
                            kernel_dsl_hash: dsl_hash,
                            device,
                            target: t.clone(),
                            out_dir,
                            cache: &artifact_cache,
                        }
                        .run()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("compile thread panicked")).collect()
        });
        let mut artifacts = results.into_iter().collect::<Result<Vec<_>, _>>()?;

        let mut stats = Vec::new();
        for a in &mut artifacts {
            match &a.target {
                Target::Amdgpu(arch) => {
                    let bytes = std::fs::read(&a.path).at(&a.path)?;
                    let meta = crate::metadata::parse_code_object(&bytes)
                        .map_err(|e| BuildError::Metadata { path: a.path.clone(), message: e.to_string() })?;
                    stats.extend(check_code_object(&device.abis, &meta, arch)?);
                }
                Target::Nvptx(_) => {
                    // Each entry's launch bound: `max_threads` of its kernel, else 1024.
                    let bound = |entry: &str| device.abis.iter().find(|k| k.symbol == entry).map_or(crate::MAX_WORK_GROUP, |k| k.max_threads);
                    let text = crate::ptx::with_max_threads(&std::fs::read_to_string(&a.path).at(&a.path)?, bound);
                    write_if_changed(&a.path, text.as_bytes())?;
                    let module = crate::ptx::parse_ptx(&text)
                        .map_err(|e| BuildError::Metadata { path: a.path.clone(), message: e.to_string() })?;
                    check_ptx(&device.abis, &module, &text)?;
                    // A variant keeps only its own kernels' entries (the driver compiles a
                    // whole module when it loads it), in a file of its own beside the
                    // cached full compile.
                    if let Some(v) = variants.iter().find(|v| Target::Nvptx(v.sm.clone()) == a.target) {
                        // A preferred name that is no entry would only lose its kernel the
                        // variant's instructions, without a word: a build error instead.
                        if let Some(k) = v.preferred.iter().find(|k| module.entry(k).is_none()) {
                            return Err(BuildError::Metadata { path: a.path.clone(), message: format!("ptx_variant_preferred names `{k}`, which is no kernel entry of the crate") });
                        }
                        let covers = |name: &str| {
                            v.required.iter().any(|k| name == k || name.strip_prefix(k.as_str()).is_some_and(|r| r.starts_with('_'))) || v.preferred.iter().any(|k| name == k)
                        };
                        let path = a.path.with_file_name(format!("kernels.{}.variant.ptx", v.sm));
                        write_if_changed(&path, crate::ptx::retain_entries(&text, covers).as_bytes())?;
                        a.path = path;
                    }
                }
            }
        }
        write_if_changed(&binaries, embedded(&crate_name, &artifacts, &stats, ptx.as_deref(), &variants).as_bytes())?;
        let report_path = out_dir.join("kernel_report.txt");
        write_if_changed(&report_path, report_text(&stats, started.elapsed().as_secs_f64()).as_bytes())?;
        Ok(BuildReport { artifacts, stats, core_origin: core.origin, rustc: rustc.version })
    }
}

/// Where sysroots and compiled kernels are cached: `$KERNEL_SYSROOT_CACHE`, else the
/// user cache folder (shared by every target directory, e.g. trybuild's), else beside the
/// target directory.
fn cache_dir(out_dir: &Path) -> PathBuf {
    if let Some(p) = env("KERNEL_SYSROOT_CACHE") {
        return PathBuf::from(p);
    }
    let user = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    match user {
        Some(dir) => dir.join("rocm-kernels-rs"),
        None => out_dir.ancestors().nth(4).unwrap_or(out_dir).join("kernel-sysroot"),
    }
}

/// `kernel-dsl/src/lib.rs`: from kernel-dsl's build script (`links`), else beside us.
fn kernel_dsl_src() -> PathBuf {
    if let Ok(p) = std::env::var("DEP_KERNEL_DSL_SRC") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernel-dsl/src/lib.rs")
}

fn embedded(crate_name: &str, artifacts: &[Artifact], stats: &[Stats], ptx_arch: Option<&str>, variants: &[Variant]) -> String {
    let mut objects = String::new();
    let mut ptx = "None".to_string();
    let mut extra = String::new();
    for a in artifacts {
        match &a.target {
            Target::Amdgpu(arch) => objects.push_str(&format!(
                "::kernel_dsl::host::CodeObject {{ arch: {arch:?}, bytes: include_bytes!({:?}) }},\n",
                a.path.display().to_string()
            )),
            Target::Nvptx(sm) => match variants.iter().find(|v| &v.sm == sm) {
                Some(v) => extra.push_str(&format!(
                    "::kernel_dsl::host::PtxVariant {{ target: {sm:?}, ptx: include_str!({:?}), kernels: &{:?}, preferred: &{:?} }},\n",
                    a.path.display().to_string(),
                    v.required,
                    v.preferred
                )),
                None => ptx = format!("Some(include_str!({:?}))", a.path.display().to_string()),
            },
        }
    }
    let mut st = String::new();
    for s in stats {
        st.push_str(&format!(
            "::kernel_dsl::host::KernelStats {{ symbol: {:?}, arch: {:?}, vgpr: {}, agpr: {}, sgpr: {}, lds_bytes: {}, scratch_bytes: {}, vgpr_spills: {}, sgpr_spills: {}, wave_size: {}, kernarg_size: {}, occupancy: {} }},\n",
            s.symbol, s.arch, s.vgpr, s.agpr, s.sgpr, s.lds_bytes, s.scratch_bytes, s.vgpr_spills, s.sgpr_spills, s.wave_size, s.kernarg_size, s.occupancy
        ));
    }
    format!(
        "::kernel_dsl::host::EmbeddedKernels {{\n crate_name: {crate_name:?},\n code_objects: &[\n{objects}],\n ptx: {ptx},\n ptx_target: {:?},\n ptx_variants: &[\n{extra}],\n stats: &[\n{st}],\n}}\n",
        ptx_arch.unwrap_or("")
    )
}

fn report_text(stats: &[Stats], secs: f64) -> String {
    let mut s = format!("kernel build report ({secs:.1} s)\n{:<40} {:<8} {:>5} {:>5} {:>5} {:>6} {:>7} {:>6} {:>4}\n", "symbol", "arch", "vgpr", "agpr", "sgpr", "lds", "scratch", "spills", "occ");
    for k in stats {
        s.push_str(&format!(
            "{:<40} {:<8} {:>5} {:>5} {:>5} {:>6} {:>7} {:>6} {:>4}\n",
            k.symbol, k.arch, k.vgpr, k.agpr, k.sgpr, k.lds_bytes, k.scratch_bytes, k.vgpr_spills + k.sgpr_spills, k.occupancy
        ));
    }
    s
}
