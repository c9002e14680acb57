//! ONNX Runtime through the `ort` crate.
//!
//! The library is loaded at run time (`load-dynamic`) from the path given at
//! start-up; a server whose ONNX Runtime cannot be loaded still starts, and
//! its ONNX models are UNAVAILABLE with the reason. The backend owns the
//! ONNX Runtime environment its sessions are made in (the binary plugs one
//! backend into the core's registry); each instance owns its session on its
//! own worker thread. A GPU instance runs the CUDA execution provider and
//! stages each batch's inputs on its device (`nereid_core::staging`).

mod graph_io;

use std::path::Path;
use std::time::Instant;

use bytes::Bytes;
use half::{bf16, f16};
use nereid_proto::inference::ModelConfig;
use ort::environment::Environment;
use ort::ep::{ExecutionProvider, ExecutionProviderDispatch};
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, Shape, Tensor as OrtTensor, TensorElementType, TensorRefMut};

use nereid_core::backend::{
    Backend, BatchInput, BatchedInstance, Device, Execution, InstanceSpec, ModelInstance, model_file,
};
use nereid_core::datatype::DataType;
use nereid_core::error::{Error, Result};
use nereid_core::model_config::autocomplete::ModelSignature;
use nereid_core::model_config::parameter;
use nereid_core::staging::{DeviceBuffer, Stager};
use nereid_core::statistics::ComputeTiming;
use nereid_core::tensor::{Tensor, bytes_elements, push_bytes_element};
use nereid_gpu::DeviceStaging;

/// The `onnxruntime` backend and the ONNX Runtime environment its sessions
/// are made in.
pub struct OnnxRuntimeBackend {
    /// Or why there is none: every ONNX model that tries to load reports it.
    environment: std::result::Result<Environment, String>,
}

impl OnnxRuntimeBackend {
    /// Loads the ONNX Runtime library from `library` and makes the
    /// environment. It fails softly: the backend then refuses every ONNX
    /// model with the reason ([`Self::unavailable`]).
    pub fn load(library: Option<&Path>) -> Self {
        OnnxRuntimeBackend {
            environment: make_environment(library),
        }
    }

    /// Why ONNX models cannot load, if they cannot.
    pub fn unavailable(&self) -> Option<&str> {
        self.environment.as_ref().err().map(String::as_str)
    }

    fn environment(&self) -> Result<&Environment> {
        self.environment
            .as_ref()
            .map_err(|reason| Error::unavailable(reason.clone()))
    }
}

fn make_environment(library: Option<&Path>) -> std::result::Result<Environment, String> {
    let library = library.ok_or_else(|| {
        "the ONNX Runtime library is not configured: pass --onnxruntime-library or set ORT_DYLIB_PATH".to_string()
    })?;
    if !library.is_file() {
        return Err(format!(
            "the ONNX Runtime library '{}' does not exist",
            library.display()
        ));
    }
    let builder = ort::init_from(library)
        .map_err(|e| format!("failed to load ONNX Runtime from '{}': {e}", library.display()))?;
    builder
        .with_name("nereid")
        .build()
        .map_err(|e| format!("failed to create the ONNX Runtime environment: {e}"))
}

impl Backend for OnnxRuntimeBackend {
    /// Read from the file's protobuf, not from a session: a session would
    /// parse every initializer, and the instance's own session does that
    /// again ([`graph_io`]).
    fn signature(&self, config: &ModelConfig, version_dir: &Path) -> Result<Option<ModelSignature>> {
        let path = model_file(config, version_dir, "model.onnx")?;
        graph_io::read(&path).map(Some)
    }

    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>> {
        let session = open(
            self.environment()?,
            spec.config,
            spec.version_dir,
            spec.device,
            spec.intra_op_threads,
        )?;
        let output_names = session.outputs().iter().map(|o| o.name().to_string()).collect();
        // A GPU instance stages each batch in pinned memory and hands ONNX
        // Runtime device buffers: one transfer per input and batch.
        let staging = match spec.device {
            Device::Cpu => None,
            Device::Gpu(ordinal) => Some(Stager::new(DeviceStaging::new(ordinal).map_err(|e| {
                Error::unavailable(format!("GPU {ordinal}: cannot stage batches for the instance: {e}"))
            })?)),
        };
        Ok(Box::new(OnnxInstance {
            session,
            output_names,
            staging,
        }))
    }

    /// When the loaded library has the CUDA execution provider (the
    /// onnxruntime-gpu build); the CPU build's models stay on the CPU.
    fn runs_on_gpu(&self) -> bool {
        self.environment().is_ok() && ort::ep::CUDA::is_available().unwrap_or(false)
    }
}

/// Creates a session for a version's model file with the config's settings.
fn open(
    environment: &Environment,
    config: &ModelConfig,
    version_dir: &Path,
    device: Device,
    threads: usize,
) -> Result<Session> {
    let path = model_file(config, version_dir, "model.onnx")?;
    let ort_error = |e: ort::Error| Error::internal(format!("ONNX Runtime: {e}"));
    let mut builder: SessionBuilder = Session::builder(environment).map_err(ort_error)?;
    let builder_error = |e: ort::Error<SessionBuilder>| ort_error(e.into());
    builder = builder.with_intra_threads(threads.max(1)).map_err(builder_error)?;
    builder = builder.with_inter_threads(1).map_err(builder_error)?;
    // ONNX Runtime's threads spin between operators by default, burning the
    // cores the server's I/O and the other instances need; opt in per model.
    let spinning = parameter(config, "intra_op_spinning").is_some_and(|v| v == "true" || v == "1");
    builder = builder.with_intra_op_spinning(spinning).map_err(builder_error)?;
    builder = builder
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(builder_error)?;
    let providers = execution_providers(config, device);
    if !providers.is_empty() {
        builder = builder.with_execution_providers(providers).map_err(builder_error)?;
    }
    builder
        .commit_from_file(&path)
        .map_err(|e| Error::invalid(format!("failed to load ONNX model '{}': {e}", path.display())))
}

/// The execution providers for an instance: CUDA on a GPU instance, with
/// TensorRT first when the config asks for it. They must register: a GPU
/// instance that silently ran on the CPU would misreport where it runs.
fn execution_providers(config: &ModelConfig, device: Device) -> Vec<ExecutionProviderDispatch> {
    let Device::Gpu(id) = device else {
        return Vec::new();
    };
    let wants_tensorrt = config
        .optimization
        .as_ref()
        .and_then(|o| o.execution_accelerators.as_ref())
        .is_some_and(|a| a.gpu_execution_accelerator.iter().any(|acc| acc.name == "tensorrt"));
    let mut providers = Vec::new();
    if wants_tensorrt {
        providers.push(
            ort::ep::TensorRT::default()
                .with_device_id(id)
                .build()
                .error_on_failure(),
        );
    }
    providers.push(ort::ep::CUDA::default().with_device_id(id).build().error_on_failure());
    providers
}

fn to_datatype(t: TensorElementType) -> Option<DataType> {
    Some(match t {
        TensorElementType::Bool => DataType::Bool,
        TensorElementType::Uint8 => DataType::Uint8,
        TensorElementType::Uint16 => DataType::Uint16,
        TensorElementType::Uint32 => DataType::Uint32,
        TensorElementType::Uint64 => DataType::Uint64,
        TensorElementType::Int8 => DataType::Int8,
        TensorElementType::Int16 => DataType::Int16,
        TensorElementType::Int32 => DataType::Int32,
        TensorElementType::Int64 => DataType::Int64,
        TensorElementType::Float16 => DataType::Fp16,
        TensorElementType::Bfloat16 => DataType::Bf16,
        TensorElementType::Float32 => DataType::Fp32,
        TensorElementType::Float64 => DataType::Fp64,
        TensorElementType::String => DataType::Bytes,
        _ => return None,
    })
}

struct OnnxInstance {
    session: Session,
    output_names: Vec<String>,
    /// On a GPU instance: where batches are gathered and copied to the device.
    staging: Option<Stager<DeviceStaging>>,
}

impl BatchedInstance for OnnxInstance {
    fn run(&mut self, inputs: Vec<BatchInput>) -> Result<Execution> {
        let started = Instant::now();
        let staged = match &mut self.staging {
            Some(stager) => stager.stage(&inputs)?,
            None => vec![None; inputs.len()],
        };
        let mut values: Vec<(String, SessionInputValue<'_>)> = Vec::with_capacity(inputs.len());
        for (input, staged) in inputs.iter().zip(staged) {
            let value = match staged {
                Some(buffer) => on_device(input, buffer)?,
                None => to_ort(input)?.into(),
            };
            values.push((input.name.clone(), value));
        }
        let input_done = Instant::now();
        let outputs = self
            .session
            .run(values)
            .map_err(|e| Error::internal(format!("ONNX Runtime failed to run: {e}")))?;
        let infer_done = Instant::now();
        let mut result = Vec::with_capacity(self.output_names.len());
        for name in &self.output_names {
            let value = outputs
                .get(name)
                .ok_or_else(|| Error::internal(format!("ONNX Runtime returned no output '{name}'")))?;
            result.push(from_ort(name, value)?);
        }
        Ok(Execution {
            outputs: result,
            timing: ComputeTiming {
                input: input_done - started,
                infer: infer_done - input_done,
                output: infer_done.elapsed(),
            },
        })
    }
}

/// A staged input as an ONNX Runtime value over its device buffer, which
/// the CUDA execution provider reads in place.
fn on_device(input: &BatchInput, buffer: DeviceBuffer) -> Result<SessionInputValue<'static>> {
    let fail = |e: ort::Error| Error::internal(format!("input '{}' on GPU {}: {e}", input.name, buffer.device));
    let memory = MemoryInfo::new(
        AllocationDevice::CUDA,
        buffer.device,
        AllocatorType::Device,
        MemoryType::Default,
    )
    .map_err(fail)?;
    let address = buffer.address as usize as *mut std::ffi::c_void;
    let shape = Shape::from(input.shape.as_slice());
    macro_rules! view {
        ($ty:ty) => {{
            // SAFETY: the staging holds `len` bytes of this input at `address`
            // on the device until the next batch is staged, after this run
            // has returned and its values were dropped; the shape's element
            // count times the element size is `len` (the batch was checked).
            #[allow(unsafe_code)]
            let view = unsafe { TensorRefMut::<$ty>::from_raw(memory, address, shape) };
            view.map(SessionInputValue::from).map_err(fail)
        }};
    }
    match input.datatype {
        DataType::Bool => view!(bool),
        DataType::Uint8 => view!(u8),
        DataType::Uint16 => view!(u16),
        DataType::Uint32 => view!(u32),
        DataType::Uint64 => view!(u64),
        DataType::Int8 => view!(i8),
        DataType::Int16 => view!(i16),
        DataType::Int32 => view!(i32),
        DataType::Int64 => view!(i64),
        DataType::Fp16 => view!(f16),
        DataType::Bf16 => view!(bf16),
        DataType::Fp32 => view!(f32),
        DataType::Fp64 => view!(f64),
        DataType::Bytes => Err(Error::internal(format!(
            "input '{}': BYTES tensors are not staged on the device",
            input.name
        ))),
    }
}

/// Copies a batch input into an ONNX Runtime value: each request's piece
/// goes straight into the tensor's buffer, the one copy on the way in.
fn to_ort(t: &BatchInput) -> Result<DynValue> {
    let shape = t.shape.clone();
    let fail = |e: ort::Error| Error::invalid(format!("input '{}': {e}", t.name));
    macro_rules! pod {
        ($ty:ty) => {{
            let mut data: Vec<$ty> = vec![<$ty as bytemuck::Zeroable>::zeroed(); t.byte_len() / size_of::<$ty>()];
            t.copy_into(bytemuck::cast_slice_mut(&mut data));
            OrtTensor::from_array((shape, data)).map(|v| v.into_dyn()).map_err(fail)
        }};
    }
    match t.datatype {
        DataType::Bool => {
            let data: Vec<bool> = t.parts.iter().flat_map(|p| p.iter().map(|b| *b != 0)).collect();
            OrtTensor::from_array((shape, data)).map(|v| v.into_dyn()).map_err(fail)
        }
        DataType::Uint8 => pod!(u8),
        DataType::Uint16 => pod!(u16),
        DataType::Uint32 => pod!(u32),
        DataType::Uint64 => pod!(u64),
        DataType::Int8 => pod!(i8),
        DataType::Int16 => pod!(i16),
        DataType::Int32 => pod!(i32),
        DataType::Int64 => pod!(i64),
        DataType::Fp16 => pod!(f16),
        DataType::Bf16 => pod!(bf16),
        DataType::Fp32 => pod!(f32),
        DataType::Fp64 => pod!(f64),
        DataType::Bytes => {
            // ONNX strings are UTF-8; Triton's BYTES may be any bytes.
            let mut strings = Vec::new();
            for part in &t.parts {
                for element in bytes_elements(part) {
                    let text = std::str::from_utf8(element?).map_err(|_| {
                        Error::invalid(format!("input '{}': ONNX string tensors must be valid UTF-8", t.name))
                    })?;
                    strings.push(text.to_owned());
                }
            }
            OrtTensor::from_string_array((shape, strings.as_slice()))
                .map(|v| v.into_dyn())
                .map_err(fail)
        }
    }
}

/// Copies an ONNX Runtime output into a tensor (the one copy on the way out).
fn from_ort(name: &str, value: &DynValue) -> Result<Tensor> {
    let element = value
        .dtype()
        .tensor_type()
        .ok_or_else(|| Error::internal(format!("output '{name}' is not a tensor")))?;
    let datatype = to_datatype(element).ok_or_else(|| {
        Error::unsupported(format!(
            "output '{name}' has element type {element:?}, which Triton cannot express"
        ))
    })?;
    let fail = |e: ort::Error| Error::internal(format!("output '{name}': {e}"));
    macro_rules! pod {
        ($ty:ty) => {{
            let (shape, data) = value.try_extract_tensor::<$ty>().map_err(fail)?;
            (shape.to_vec(), Bytes::copy_from_slice(bytemuck::cast_slice(data)))
        }};
    }
    let (shape, data) = match datatype {
        DataType::Bool => {
            let (shape, data) = value.try_extract_tensor::<bool>().map_err(fail)?;
            (
                shape.to_vec(),
                data.iter().map(|b| u8::from(*b)).collect::<Vec<u8>>().into(),
            )
        }
        DataType::Uint8 => pod!(u8),
        DataType::Uint16 => pod!(u16),
        DataType::Uint32 => pod!(u32),
        DataType::Uint64 => pod!(u64),
        DataType::Int8 => pod!(i8),
        DataType::Int16 => pod!(i16),
        DataType::Int32 => pod!(i32),
        DataType::Int64 => pod!(i64),
        DataType::Fp16 => pod!(f16),
        DataType::Bf16 => pod!(bf16),
        DataType::Fp32 => pod!(f32),
        DataType::Fp64 => pod!(f64),
        DataType::Bytes => {
            let (shape, strings) = value.try_extract_strings().map_err(fail)?;
            let mut out = Vec::new();
            for s in &strings {
                push_bytes_element(&mut out, s.as_bytes())?;
            }
            (shape.to_vec(), Bytes::from(out))
        }
    };
    Ok(Tensor::new(name, datatype, shape, data))
}
