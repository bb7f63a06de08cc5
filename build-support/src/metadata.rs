//! Reading AMDGPU code objects: the kernel metadata note and an occupancy estimate.
//!
//! An AMDGPU code object is an ELF64 little-endian shared object with `e_machine ==
//! EM_AMDGPU` (224). Since code object v3 its kernel metadata is a MessagePack map stored
//! in an ELF note with owner `"AMDGPU"` and type `NT_AMDGPU_METADATA` (32), found in the
//! `PT_NOTE` segment (and the `.note` section). The map's layout is documented in LLVM's
//! `AMDGPUUsage` ("Code Object V4/V5 Metadata"): top-level keys `amdhsa.version`,
//! `amdhsa.target` and `amdhsa.kernels`, per-kernel keys with a leading dot (`.name`,
//! `.symbol`, `.args`, `.sgpr_count`, ...).
//!
//! [`parse_code_object`] decodes that note into [`CodeObjectMetadata`];
//! [`occupancy`] estimates how many waves of a kernel fit on one SIMD.
//!
//! Note on dynamic LDS: there is no kernel-level "uses dynamic LDS" key in the metadata.
//! LLVM only records it through the `hidden_dynamic_lds_size` implicit argument (code
//! object v5), and optimized rustc builds drop all hidden arguments because nothing reads
//! the implicit-argument pointer. So for an optimized kernel using rustc's
//! `gpu_launch_sized_workgroup_mem`, [`KernelMetadata::dynamic_lds`] is `false` (the
//! fixtures show this); at `-Copt-level=0` the hidden arguments are kept and it is `true`.

use std::fmt;

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};
use rmpv::Value;

/// `e_machine` of AMDGPU code objects.
pub const EM_AMDGPU: u16 = 224;

/// ELF note type of the MessagePack kernel metadata (code object v3 and later).
pub const NT_AMDGPU_METADATA: u32 = 32;

/// Owner (name) of the AMDGPU notes, without the terminating NUL.
const NOTE_OWNER: &[u8] = b"AMDGPU";

/// Everything the metadata note of one code object says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeObjectMetadata {
    /// Full target id from `amdhsa.target`, e.g. `"amdgcn-amd-amdhsa--gfx90a"` or
    /// `"amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"`.
    pub target: String,
    /// Processor name parsed from [`target`](Self::target), target features stripped,
    /// e.g. `"gfx90a"`.
    pub arch: String,
    /// `amdhsa.version` as (major, minor): (1, 1) is code object v4, (1, 2) is v5,
    /// (1, 3) is v6.
    pub version: (u64, u64),
    /// The kernels, in the order of the metadata.
    pub kernels: Vec<KernelMetadata>,
}

impl CodeObjectMetadata {
    /// The kernel whose `.name` is `name`, if any.
    pub fn kernel(&self, name: &str) -> Option<&KernelMetadata> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

/// Metadata of one kernel (one entry of `amdhsa.kernels`).
///
/// Required keys (missing ones give [`MetadataError::MissingField`]): `.name`, `.symbol`,
/// `.kernarg_segment_size`, `.sgpr_count`, `.vgpr_count`, `.wavefront_size`. Every other
/// numeric field is 0 and every flag `false` when its key is absent (`.agpr_count`, for
/// instance, only exists on targets with MFMA/AGPRs; RDNA objects have none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelMetadata {
    /// Source name of the kernel (`.name`), e.g. `"saxpy"`.
    pub name: String,
    /// Symbol of the kernel descriptor (`.symbol`), e.g. `"saxpy.kd"`.
    pub symbol: String,
    /// Kernel arguments (`.args`) in kernarg order, hidden arguments included.
    pub args: Vec<ArgMetadata>,
    /// Bytes of the kernarg segment (`.kernarg_segment_size`), hidden arguments included.
    pub kernarg_segment_size: u32,
    /// Alignment of the kernarg segment (`.kernarg_segment_align`).
    pub kernarg_segment_align: u32,
    /// Static LDS bytes per workgroup (`.group_segment_fixed_size`); dynamic LDS comes on
    /// top of this at launch.
    pub group_segment_fixed_size: u32,
    /// Scratch bytes per work-item (`.private_segment_fixed_size`).
    pub private_segment_fixed_size: u32,
    /// SGPRs per wave (`.sgpr_count`), VCC/FLAT_SCRATCH/XNACK included.
    pub sgpr_count: u32,
    /// VGPRs per work-item (`.vgpr_count`). On gfx90a/gfx94x LLVM writes the *unified*
    /// count here, `alignTo(arch_vgprs, 4) + agprs` when AGPRs are used
    /// (`AMDGPU::getTotalNumVGPRs`).
    pub vgpr_count: u32,
    /// AGPRs (accumulation registers) per work-item (`.agpr_count`; 0 when absent).
    pub agpr_count: u32,
    /// SGPRs spilled (`.sgpr_spill_count`).
    pub sgpr_spill_count: u32,
    /// VGPRs spilled (`.vgpr_spill_count`).
    pub vgpr_spill_count: u32,
    /// Wave size, 32 or 64 (`.wavefront_size`).
    pub wavefront_size: u32,
    /// Largest workgroup the kernel was compiled for (`.max_flat_workgroup_size`).
    pub max_flat_workgroup_size: u32,
    /// The kernel needs a dynamically sized stack (`.uses_dynamic_stack`), i.e. its
    /// scratch size is only a lower bound.
    pub uses_dynamic_stack: bool,
    /// The metadata says the kernel uses dynamically sized LDS: an argument is
    /// `dynamic_shared_pointer` or `hidden_dynamic_lds_size`, or a `.uses_dynamic_lds` /
    /// `.dynamic_lds` flag is true. `false` otherwise, which includes optimized rustc
    /// kernels using `gpu_launch_sized_workgroup_mem` (their hidden arguments, and with
    /// them `hidden_dynamic_lds_size`, are optimized away): do not rely on it alone.
    pub dynamic_lds: bool,
}

impl KernelMetadata {
    /// The arguments written by the caller, i.e. all but the `hidden_*` ones, in order.
    pub fn explicit_args(&self) -> impl Iterator<Item = &ArgMetadata> {
        self.args.iter().filter(|a| !a.value_kind.is_hidden())
    }

    /// Total register spills: `sgpr_spill_count + vgpr_spill_count`.
    pub fn spills(&self) -> u32 {
        self.sgpr_spill_count.saturating_add(self.vgpr_spill_count)
    }
}

/// One kernel argument (an entry of `.args`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgMetadata {
    /// Byte offset in the kernarg segment (`.offset`).
    pub offset: u32,
    /// Size in bytes (`.size`).
    pub size: u32,
    /// What the argument is (`.value_kind`).
    pub value_kind: ArgValueKind,
    /// Address space of pointer arguments (`.address_space`: `"global"`, `"generic"`,
    /// `"constant"`, ...).
    pub address_space: Option<String>,
    /// How the kernel accesses the pointee, when LLVM could tell (`.actual_access`:
    /// `"read_only"`, `"write_only"`, `"read_write"`).
    pub actual_access: Option<String>,
    /// Argument name (`.name`); rustc does not emit it.
    pub name: Option<String>,
}

/// `.value_kind` of an argument.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ArgValueKind {
    /// `by_value`: the bytes of a scalar or struct.
    ByValue,
    /// `global_buffer`: a pointer to global (or generic) memory.
    GlobalBuffer,
    /// `dynamic_shared_pointer`: a pointer to dynamically allocated LDS.
    DynamicSharedPointer,
    /// Any `hidden_*` kind (implicit arguments filled by the runtime); holds the full kind,
    /// e.g. `"hidden_block_count_x"`.
    Hidden(String),
    /// Any other kind (`image`, `sampler`, `pipe`, `queue`, ...), verbatim.
    Other(String),
}

impl ArgValueKind {
    /// Maps a `.value_kind` string to its variant.
    pub fn from_kind(kind: &str) -> Self {
        match kind {
            "by_value" => Self::ByValue,
            "global_buffer" => Self::GlobalBuffer,
            "dynamic_shared_pointer" => Self::DynamicSharedPointer,
            k if k.starts_with("hidden_") => Self::Hidden(k.to_string()),
            k => Self::Other(k.to_string()),
        }
    }

    /// The `.value_kind` string, as written in the metadata.
    pub fn as_str(&self) -> &str {
        match self {
            Self::ByValue => "by_value",
            Self::GlobalBuffer => "global_buffer",
            Self::DynamicSharedPointer => "dynamic_shared_pointer",
            Self::Hidden(s) | Self::Other(s) => s,
        }
    }

    /// Whether this is a `hidden_*` argument (filled by the runtime, not the caller).
    pub fn is_hidden(&self) -> bool {
        matches!(self, Self::Hidden(_))
    }
}

impl fmt::Display for ArgValueKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a code object's metadata could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// The bytes are not a well-formed ELF file (or its headers/notes point outside it).
    #[error("not a valid ELF file: {0}")]
    NotElf(String),
    /// The ELF file is not an AMDGPU code object.
    #[error("ELF file is not an AMDGPU code object: e_machine is {machine} ({}), expected {EM_AMDGPU} (EM_AMDGPU)", machine_name(*.machine))]
    NotAmdgpu {
        /// The file's `e_machine`.
        machine: u16,
    },
    /// No `AMDGPU` note of type `NT_AMDGPU_METADATA` (32) was found.
    #[error("code object has no AMDGPU metadata note (owner \"AMDGPU\", type NT_AMDGPU_METADATA = 32); code objects older than v3 are not supported")]
    NoMetadataNote,
    /// The note's MessagePack could not be decoded or does not have the documented shape.
    #[error("malformed AMDGPU metadata: {0}")]
    BadMessagePack(String),
    /// A required key is absent.
    #[error("AMDGPU metadata of {kernel} lacks the required field `{field}`")]
    MissingField {
        /// `kernel `name``, `kernel #index` when the name itself is missing, or
        /// `the code object` for top-level keys.
        kernel: String,
        /// The missing key, e.g. `".sgpr_count"` or `".args[].offset"`.
        field: &'static str,
    },
}

fn machine_name(machine: u16) -> &'static str {
    match machine {
        elf::EM_X86_64 => "x86-64",
        elf::EM_386 => "x86",
        elf::EM_AARCH64 => "AArch64",
        elf::EM_ARM => "ARM",
        elf::EM_RISCV => "RISC-V",
        elf::EM_PPC64 => "PowerPC64",
        elf::EM_CUDA => "NVIDIA CUDA",
        elf::EM_BPF => "BPF",
        elf::EM_NONE => "no machine",
        _ => "unknown machine",
    }
}

/// Reads the kernel metadata of an AMDGPU code object (ELF, code object v3/v4/v5/v6).
///
/// Errors: [`MetadataError::NotElf`] for bytes that are not ELF or whose headers or notes
/// are out of bounds, [`MetadataError::NotAmdgpu`] for another machine,
/// [`MetadataError::NoMetadataNote`] when the note is absent,
/// [`MetadataError::BadMessagePack`] when the note does not decode to the documented map,
/// [`MetadataError::MissingField`] when a required key is missing.
pub fn parse_code_object(bytes: &[u8]) -> Result<CodeObjectMetadata, MetadataError> {
    // `object` reads ELF structures in place and needs them 8-byte aligned; data from
    // `include_bytes!` or a sub-slice may not be, so copy it into aligned storage then.
    if bytes.as_ptr().align_offset(8) != 0 {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        let aligned = &mut object::pod::bytes_of_slice_mut(&mut words)[..bytes.len()];
        aligned.copy_from_slice(bytes);
        return parse_aligned(aligned);
    }
    parse_aligned(bytes)
}

fn parse_aligned(bytes: &[u8]) -> Result<CodeObjectMetadata, MetadataError> {
    let desc = find_metadata_note(bytes)?;
    let mut reader = desc;
    let value = rmpv::decode::read_value(&mut reader)
        .map_err(|e| MetadataError::BadMessagePack(format!("cannot decode MessagePack ({} bytes): {e}", desc.len())))?;
    decode_document(&value)
}

// ---------------------------------------------------------------------------------------
// ELF
// ---------------------------------------------------------------------------------------

fn find_metadata_note(bytes: &[u8]) -> Result<&[u8], MetadataError> {
    if bytes.len() < 4 || bytes[..4] != elf::ELFMAG {
        return Err(MetadataError::NotElf(if bytes.len() < 4 {
            format!("file is only {} bytes long", bytes.len())
        } else {
            "missing the \\x7fELF magic".to_string()
        }));
    }
    let class = bytes.get(4 /* EI_CLASS */).copied().unwrap_or(0);
    match class {
        elf::ELFCLASS64 => {}
        elf::ELFCLASS32 => {
            // AMDGPU code objects are always ELF64; report the machine of an ELF32 file.
            let header = elf::FileHeader32::<object::Endianness>::parse(bytes).map_err(not_elf)?;
            let endian = header.endian().map_err(not_elf)?;
            let machine = header.e_machine(endian);
            return Err(if machine == EM_AMDGPU {
                MetadataError::NotElf("AMDGPU ELF file is 32-bit (r600?); code objects are ELF64".into())
            } else {
                MetadataError::NotAmdgpu { machine }
            });
        }
        other => return Err(MetadataError::NotElf(format!("unknown ELF class {other}"))),
    }
    if bytes.len() < 64 {
        return Err(MetadataError::NotElf(format!(
            "file is {} bytes long, too short for an ELF64 header (64 bytes)",
            bytes.len()
        )));
    }
    let header = elf::FileHeader64::<object::Endianness>::parse(bytes).map_err(not_elf)?;
    let endian = header.endian().map_err(not_elf)?;
    let machine = header.e_machine(endian);
    if machine != EM_AMDGPU {
        return Err(MetadataError::NotAmdgpu { machine });
    }

    // Loadable code objects carry the note in a PT_NOTE segment; relocatable objects
    // (no program headers) only in a SHT_NOTE section.
    let phdrs = header.program_headers(endian, bytes).map_err(not_elf)?;
    let mut saw_note_segment = false;
    for phdr in phdrs {
        if let Some(mut notes) = phdr
            .notes(endian, bytes)
            .map_err(|e| not_elf_ctx("PT_NOTE segment", e))?
        {
            saw_note_segment = true;
            while let Some(note) = notes.next().map_err(|e| not_elf_ctx("PT_NOTE segment", e))? {
                if note.name() == NOTE_OWNER && note.n_type(endian) == NT_AMDGPU_METADATA {
                    return Ok(note.desc());
                }
            }
        }
    }
    if !saw_note_segment {
        let sections = header.sections(endian, bytes).map_err(not_elf)?;
        for section in sections.iter() {
            if let Some(mut notes) = section
                .notes(endian, bytes)
                .map_err(|e| not_elf_ctx("note section", e))?
            {
                while let Some(note) = notes.next().map_err(|e| not_elf_ctx("note section", e))? {
                    if note.name() == NOTE_OWNER && note.n_type(endian) == NT_AMDGPU_METADATA {
                        return Ok(note.desc());
                    }
                }
            }
        }
    }
    Err(MetadataError::NoMetadataNote)
}

fn not_elf(e: object::read::Error) -> MetadataError {
    MetadataError::NotElf(e.to_string())
}

fn not_elf_ctx(what: &str, e: object::read::Error) -> MetadataError {
    MetadataError::NotElf(format!("{what}: {e} (truncated or corrupt note?)"))
}

// ---------------------------------------------------------------------------------------
// MessagePack document
// ---------------------------------------------------------------------------------------

type Map = [(Value, Value)];

fn get<'a>(map: &'a Map, key: &str) -> Option<&'a Value> {
    map.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
}

fn bad(msg: impl Into<String>) -> MetadataError {
    MetadataError::BadMessagePack(msg.into())
}

fn decode_document(doc: &Value) -> Result<CodeObjectMetadata, MetadataError> {
    let top = doc
        .as_map()
        .ok_or_else(|| bad(format!("top level is {}, expected a map", type_name(doc))))?;
    let whole = || "the code object".to_string();

    let version_v = get(top, "amdhsa.version").ok_or(MetadataError::MissingField {
        kernel: whole(),
        field: "amdhsa.version",
    })?;
    let version = match version_v.as_array().map(|a| a.as_slice()) {
        Some([major, minor, ..]) => match (major.as_u64(), minor.as_u64()) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(bad("`amdhsa.version` must hold two unsigned integers")),
        },
        _ => {
            return Err(bad(format!(
                "`amdhsa.version` is {}, expected [major, minor]",
                type_name(version_v)
            )))
        }
    };

    let target_v = get(top, "amdhsa.target").ok_or(MetadataError::MissingField {
        kernel: whole(),
        field: "amdhsa.target",
    })?;
    let target = target_v
        .as_str()
        .ok_or_else(|| bad(format!("`amdhsa.target` is {}, expected a string", type_name(target_v))))?
        .to_string();
    let arch = arch_from_target(&target)
        .ok_or_else(|| bad(format!("cannot find a processor name in `amdhsa.target` = {target:?}")))?;

    let kernels_v = get(top, "amdhsa.kernels").ok_or(MetadataError::MissingField {
        kernel: whole(),
        field: "amdhsa.kernels",
    })?;
    let kernels_a = kernels_v.as_array().ok_or_else(|| {
        bad(format!(
            "`amdhsa.kernels` is {}, expected an array",
            type_name(kernels_v)
        ))
    })?;
    let kernels = kernels_a
        .iter()
        .enumerate()
        .map(|(i, k)| decode_kernel(i, k))
        .collect::<Result<Vec<_>, _>>()?;

    Ok(CodeObjectMetadata {
        target,
        arch,
        version,
        kernels,
    })
}

/// Processor from a target id: `amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-` -> `gfx90a`.
/// Also accepts a bare processor (`gfx90a`, `gfx90a:xnack-`).
fn arch_from_target(target: &str) -> Option<String> {
    let without_features = target.split(':').next().unwrap_or("");
    let arch = without_features.rsplit('-').next().unwrap_or("");
    if arch.is_empty() {
        None
    } else {
        Some(arch.to_string())
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "binary data",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an extension value",
    }
}

/// Field access for one kernel, naming the kernel in errors.
struct KernelCtx<'a> {
    map: &'a Map,
    label: String,
}

impl KernelCtx<'_> {
    fn u32_opt(&self, key: &'static str) -> Result<Option<u32>, MetadataError> {
        match get(self.map, key) {
            None => Ok(None),
            Some(v) => as_u32(v).map(Some).ok_or_else(|| {
                bad(format!(
                    "{}: `{key}` is {}, expected an unsigned 32-bit integer",
                    self.label,
                    describe(v)
                ))
            }),
        }
    }

    fn u32_req(&self, key: &'static str) -> Result<u32, MetadataError> {
        self.u32_opt(key)?.ok_or_else(|| self.missing(key))
    }

    fn u32_or0(&self, key: &'static str) -> Result<u32, MetadataError> {
        Ok(self.u32_opt(key)?.unwrap_or(0))
    }

    fn bool_or_false(&self, key: &'static str) -> Result<bool, MetadataError> {
        match get(self.map, key) {
            None => Ok(false),
            Some(Value::Boolean(b)) => Ok(*b),
            // LLVM writes some flags (`.uniform_work_group_size`) as 0/1; accept both forms.
            Some(v) if v.as_u64().is_some() => Ok(v.as_u64() != Some(0)),
            Some(v) => Err(bad(format!(
                "{}: `{key}` is {}, expected a boolean",
                self.label,
                describe(v)
            ))),
        }
    }

    fn str_req(&self, key: &'static str) -> Result<String, MetadataError> {
        match get(self.map, key) {
            None => Err(self.missing(key)),
            Some(v) => v
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("{}: `{key}` is {}, expected a string", self.label, describe(v)))),
        }
    }

    fn missing(&self, field: &'static str) -> MetadataError {
        MetadataError::MissingField {
            kernel: self.label.clone(),
            field,
        }
    }
}

fn as_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn describe(v: &Value) -> String {
    match v {
        Value::Integer(i) => format!("the integer {i}"),
        Value::String(s) => format!("the string {:?}", s.as_str().unwrap_or("<invalid UTF-8>")),
        other => type_name(other).to_string(),
    }
}

fn decode_kernel(index: usize, v: &Value) -> Result<KernelMetadata, MetadataError> {
    let map = v
        .as_map()
        .ok_or_else(|| bad(format!("amdhsa.kernels[{index}] is {}, expected a map", type_name(v))))?;
    let provisional = match get(map, ".name").and_then(Value::as_str) {
        Some(name) => format!("kernel `{name}`"),
        None => format!("kernel #{index}"),
    };
    let k = KernelCtx {
        map,
        label: provisional,
    };

    let name = k.str_req(".name")?;
    let symbol = k.str_req(".symbol")?;

    let args = match get(map, ".args") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, a)| decode_arg(&k.label, i, a))
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(bad(format!(
                "{}: `.args` is {}, expected an array",
                k.label,
                type_name(other)
            )))
        }
    };

    let dynamic_lds = k.bool_or_false(".uses_dynamic_lds")?
        || k.bool_or_false(".dynamic_lds")?
        || args.iter().any(|a| {
            a.value_kind == ArgValueKind::DynamicSharedPointer || a.value_kind.as_str() == "hidden_dynamic_lds_size"
        });

    Ok(KernelMetadata {
        name,
        symbol,
        kernarg_segment_size: k.u32_req(".kernarg_segment_size")?,
        kernarg_segment_align: k.u32_or0(".kernarg_segment_align")?,
        group_segment_fixed_size: k.u32_or0(".group_segment_fixed_size")?,
        private_segment_fixed_size: k.u32_or0(".private_segment_fixed_size")?,
        sgpr_count: k.u32_req(".sgpr_count")?,
        vgpr_count: k.u32_req(".vgpr_count")?,
        agpr_count: k.u32_or0(".agpr_count")?,
        sgpr_spill_count: k.u32_or0(".sgpr_spill_count")?,
        vgpr_spill_count: k.u32_or0(".vgpr_spill_count")?,
        wavefront_size: k.u32_req(".wavefront_size")?,
        max_flat_workgroup_size: k.u32_or0(".max_flat_workgroup_size")?,
        uses_dynamic_stack: k.bool_or_false(".uses_dynamic_stack")?,
        dynamic_lds,
        args,
    })
}

fn decode_arg(kernel: &str, index: usize, v: &Value) -> Result<ArgMetadata, MetadataError> {
    let map = v.as_map().ok_or_else(|| {
        bad(format!(
            "{kernel}: `.args[{index}]` is {}, expected a map",
            type_name(v)
        ))
    })?;
    let label = format!("{kernel} argument #{index}");
    let missing = |field| MetadataError::MissingField {
        kernel: kernel.to_string(),
        field,
    };
    let num = |key: &'static str, field: &'static str| -> Result<u32, MetadataError> {
        match get(map, key) {
            None => Err(missing(field)),
            Some(v) => as_u32(v).ok_or_else(|| {
                bad(format!(
                    "{label}: `{key}` is {}, expected an unsigned 32-bit integer",
                    describe(v)
                ))
            }),
        }
    };
    let opt_str = |key: &'static str| -> Result<Option<String>, MetadataError> {
        match get(map, key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(|s| Some(s.to_string()))
                .ok_or_else(|| bad(format!("{label}: `{key}` is {}, expected a string", describe(v)))),
        }
    };
    let offset = num(".offset", ".args[].offset")?;
    let size = num(".size", ".args[].size")?;
    let value_kind = match opt_str(".value_kind")? {
        Some(kind) => ArgValueKind::from_kind(&kind),
        None => return Err(missing(".args[].value_kind")),
    };
    Ok(ArgMetadata {
        offset,
        size,
        value_kind,
        address_space: opt_str(".address_space")?,
        actual_access: opt_str(".actual_access")?,
        name: opt_str(".name")?,
    })
}

// ---------------------------------------------------------------------------------------
// Occupancy
// ---------------------------------------------------------------------------------------

/// Result of [`occupancy`]: resident waves per SIMD and what limits them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// Waves of this kernel that can be resident on one SIMD at once (0: a workgroup of
    /// the requested shape cannot be launched at all).
    pub waves_per_simd: u32,
    /// The binding limit: `"vgpr"`, `"sgpr"`, `"lds"` or `"hardware"` (the wave slots
    /// of the SIMD, workgroup/barrier slots of the CU, or an impossible workgroup size).
    /// When a resource allows exactly as much as the hardware, `"hardware"` is reported.
    pub limited_by: &'static str,
}

/// Per-architecture figures used by [`occupancy`].
///
/// Sources (LLVM `llvm/lib/Target/AMDGPU/Utils/AMDGPUBaseInfo.cpp`, `IsaInfo` namespace,
/// and `AMDGPUAsmPrinter.cpp`; AMD "CDNA 2/CDNA 3 Instruction Set Architecture" and
/// "RDNA 2/RDNA 3 Instruction Set Architecture" reference guides, chapter 1):
///
/// | arch | wave | VGPRs/SIMD-lane (`getTotalNumVGPRs`) | VGPR granule (`getVGPRAllocGranule`) | max waves/SIMD (`getMaxWavesPerEU`) | SIMDs per CU/WGP (`getEUsPerCU`) | LDS per CU/WGP (`getLocalMemorySize`) | max LDS per WG | WG slots (`getMaxWorkGroupsPerCU` barriers) | SGPR limit (`getOccupancyWithNumSGPRs`) |
/// |---|---|---|---|---|---|---|---|---|---|
/// | gfx90a (CDNA2), gfx940/941/942 (CDNA3) | 64 | 512 unified VGPR+AGPR | 8 | 8 | 4 | 64 KiB | 64 KiB | 16 | ≤80:10, ≤88:9, ≤100:8, else 7 |
/// | gfx950 (CDNA4) | 64 | 512 unified VGPR+AGPR | 8 | 8 | 4 | 160 KiB | 160 KiB | 16 | ≤80:10, ≤88:9, ≤100:8, else 7 |
/// | gfx1030–gfx1036 (RDNA2) | 32 (64) | 1024 (512) | 16 (8) | 16 | 4 (WGP mode) | 128 KiB (WGP) | 64 KiB | 32 | not limiting |
/// | gfx1100, gfx1101 (RDNA3, 1.5× VGPRs) | 32 (64) | 1536 (768) | 24 (12) | 16 | 4 (WGP mode) | 128 KiB (WGP) | 64 KiB | 32 | not limiting |
/// | gfx1102, gfx1103 (RDNA3) | 32 (64) | 1024 (512) | 16 (8) | 16 | 4 (WGP mode) | 128 KiB (WGP) | 64 KiB | 32 | not limiting |
/// | gfx1151 (RDNA3.5), gfx1200, gfx1201 (RDNA4) | 32 (64) | 1536 (768) | 24 (12) | 16 | 4 (WGP mode) | 128 KiB (WGP) | 64 KiB | 32 | not limiting |
///
/// gfx950, gfx1151 and gfx12 rows were checked against LLVM 22's `llc`: a 100-VGPR
/// kernel reports occupancy 12 on gfx1100/gfx1151/gfx1200/gfx1201 (1536 VGPRs) and 9 on
/// gfx1102 (1024); 160 KiB of LDS compiles for gfx950 and is rejected (over 64 KiB) for
/// gfx942, gfx1151 and gfx1200.
///
/// LDS is allocated in 512-byte blocks (128 dwords, "LDS is allocated in 128 dword
/// blocks", `AMDGPUAsmPrinter::getSIProgramInfo`; `GRANULATED_LDS_SIZE` in AMDGPUUsage).
///
/// RDNA: LLVM compiles gfx10+/gfx11 kernels in WGP mode by default (the metadata says
/// `.workgroup_processor_mode: 1`), where "per CU" means per WGP: two CUs = 4 SIMDs
/// sharing 128 KiB of LDS and 32 barrier slots. In CU mode the same figures are halved
/// (2 SIMDs, 64 KiB, 16 barriers), which gives the same per-SIMD ratios.
#[derive(Clone, Copy, Debug)]
struct ArchTable {
    /// true: gfx90a/gfx94x/gfx950 (wave64 only, unified VGPR/AGPR file, gfx9 SGPR rule).
    cdna: bool,
    /// VGPRs per SIMD lane for wave32 (RDNA) or wave64 (CDNA).
    vgprs_per_simd: u32,
    /// VGPR allocation granule for wave32 (RDNA) or wave64 (CDNA).
    vgpr_granule: u32,
    max_waves_per_simd: u32,
    simds_per_cu: u32,
    lds_per_cu: u32,
    max_lds_per_workgroup: u32,
    max_workgroups_per_cu: u32,
}

const LDS_GRANULE: u32 = 512;

const CDNA: ArchTable = ArchTable {
    cdna: true,
    vgprs_per_simd: 512,
    vgpr_granule: 8,
    max_waves_per_simd: 8,
    simds_per_cu: 4,
    lds_per_cu: 64 * 1024,
    max_lds_per_workgroup: 64 * 1024,
    max_workgroups_per_cu: 16,
};

const RDNA_1024: ArchTable = ArchTable {
    cdna: false,
    vgprs_per_simd: 1024,
    vgpr_granule: 16,
    max_waves_per_simd: 16,
    simds_per_cu: 4,
    lds_per_cu: 128 * 1024,
    max_lds_per_workgroup: 64 * 1024,
    max_workgroups_per_cu: 32,
};

const CDNA4: ArchTable = ArchTable {
    lds_per_cu: 160 * 1024,
    max_lds_per_workgroup: 160 * 1024,
    ..CDNA
};

const RDNA_1536: ArchTable = ArchTable {
    vgprs_per_simd: 1536,
    vgpr_granule: 24,
    ..RDNA_1024
};

fn arch_table(arch: &str) -> Option<ArchTable> {
    // Accept "gfx90a", "gfx90a:xnack-" or a whole target id.
    let arch = arch_from_target(arch.trim())?;
    Some(match arch.as_str() {
        "gfx90a" | "gfx940" | "gfx941" | "gfx942" => CDNA,
        "gfx950" => CDNA4,
        "gfx1030" | "gfx1031" | "gfx1032" | "gfx1033" | "gfx1034" | "gfx1035" | "gfx1036" => RDNA_1024,
        "gfx1100" | "gfx1101" | "gfx1151" | "gfx1200" | "gfx1201" => RDNA_1536,
        "gfx1102" | "gfx1103" => RDNA_1024,
        _ => return None,
    })
}

/// Estimates how many waves of kernel `k` fit on one SIMD of `arch` when launched with
/// `workgroup_size` work-items per workgroup and `dynamic_lds_bytes` of dynamic LDS per
/// workgroup. `None` for an architecture without a table (see below for the list).
///
/// Model (the one LLVM's `GCNSubtarget` occupancy helpers use, plus whole-workgroup
/// residency):
/// * VGPRs: `min(max_waves, vgprs_per_simd / alignTo(vgpr, granule))`; on gfx90a/gfx94x
///   the register count is `max(.vgpr_count, .agpr_count)`, because LLVM already writes
///   the unified `alignTo(arch_vgpr, 4) + agpr` into `.vgpr_count`.
/// * SGPRs: gfx9 table of `getOccupancyWithNumSGPRs` on CDNA; never limiting on RDNA.
/// * LDS: `.group_segment_fixed_size + dynamic_lds_bytes`, rounded up to 512 bytes;
///   workgroups per CU = LDS per CU / that. More than the per-workgroup maximum (64 KiB;
///   160 KiB on gfx950): 0 waves.
/// * Hardware: `max_waves` per SIMD and at most 16 (CDNA) / 32 (RDNA WGP) multi-wave
///   workgroups per CU; a workgroup larger than 1024 work-items or than
///   `.max_flat_workgroup_size` cannot launch (0 waves).
/// * Whole workgroups: each per-SIMD limit is turned into workgroups per CU
///   (`limit * simds / waves_per_workgroup`, rounded down), the smallest wins, and the
///   result is `ceil(workgroups * waves_per_workgroup / simds)` capped at `max_waves`.
///
/// A `workgroup_size` of 0 is treated as 1. Scratch is not modelled. Architectures: gfx90a, gfx940, gfx941, gfx942, gfx950,
/// gfx1030–gfx1036, gfx1100–gfx1103, gfx1151, gfx1200, gfx1201 (a target id or a name with `:feature±` suffixes is accepted too).
/// The figures and their sources are listed on the table in the source
/// (`ArchTable`).
///
/// Example: vgpr 8, sgpr 14, no LDS, 256 work-items on gfx90a gives 8 waves/SIMD, limited
/// by `"hardware"`.
pub fn occupancy(arch: &str, k: &KernelMetadata, workgroup_size: u32, dynamic_lds_bytes: u32) -> Option<Occupancy> {
    let t = arch_table(arch)?;
    let none = |limited_by| {
        Some(Occupancy {
            waves_per_simd: 0,
            limited_by,
        })
    };

    // Wave size: CDNA is wave64 only; RDNA kernels say which mode they were compiled for.
    let wave = if t.cdna || k.wavefront_size == 64 { 64 } else { 32 };
    // RDNA in wave64 mode: half the VGPRs per lane and half the granule
    // (`getTotalNumVGPRs` / `getVGPRAllocGranule` with IsWave32 false).
    let (vgprs_per_simd, vgpr_granule) = if !t.cdna && wave == 64 {
        (t.vgprs_per_simd / 2, t.vgpr_granule / 2)
    } else {
        (t.vgprs_per_simd, t.vgpr_granule)
    };

    let workgroup_size = workgroup_size.max(1);
    if workgroup_size > 1024 || (k.max_flat_workgroup_size != 0 && workgroup_size > k.max_flat_workgroup_size) {
        return none("hardware");
    }
    let waves_per_wg = workgroup_size.div_ceil(wave);
    let simds = t.simds_per_cu;
    let max_waves = t.max_waves_per_simd;

    // Per-SIMD wave limits from registers (`getNumWavesPerEUWithNumVGPRs`).
    let vgprs = if t.cdna {
        k.vgpr_count.max(k.agpr_count)
    } else {
        k.vgpr_count
    };
    let vgpr_waves = {
        let rounded = vgprs.max(1).div_ceil(vgpr_granule) * vgpr_granule;
        (vgprs_per_simd / rounded).clamp(1, max_waves)
    };
    // `getOccupancyWithNumSGPRs`: gfx9 (VOLCANIC_ISLANDS..GFX9) table; GFX10+ not limiting.
    let sgpr_waves = if t.cdna {
        let w = match k.sgpr_count {
            0..=80 => 10,
            81..=88 => 9,
            89..=100 => 8,
            _ => 7,
        };
        w.min(max_waves)
    } else {
        max_waves
    };

    // Workgroups per CU allowed by each limit.
    let to_wgs = |waves_per_simd: u32| waves_per_simd * simds / waves_per_wg;
    let hw_wgs = if waves_per_wg == 1 {
        // Single-wave workgroups need no barrier slot (`getMaxWorkGroupsPerCU`).
        max_waves * simds
    } else {
        to_wgs(max_waves).min(t.max_workgroups_per_cu)
    };
    let lds = u64::from(k.group_segment_fixed_size) + u64::from(dynamic_lds_bytes);
    if lds > u64::from(t.max_lds_per_workgroup) {
        return none("lds");
    }
    let lds_wgs = if lds == 0 {
        u32::MAX
    } else {
        let rounded = lds.div_ceil(u64::from(LDS_GRANULE)) * u64::from(LDS_GRANULE);
        (u64::from(t.lds_per_cu) / rounded) as u32
    };

    // Ties go to "hardware" first, then in this order.
    let candidates = [
        ("hardware", hw_wgs),
        ("vgpr", to_wgs(vgpr_waves)),
        ("sgpr", to_wgs(sgpr_waves)),
        ("lds", lds_wgs),
    ];
    let (limited_by, wgs) = candidates
        .iter()
        .copied()
        .fold(candidates[0], |best, c| if c.1 < best.1 { c } else { best });

    let waves_per_simd = (wgs * waves_per_wg).div_ceil(simds).min(max_waves);
    Some(Occupancy {
        waves_per_simd,
        limited_by,
    })
}
