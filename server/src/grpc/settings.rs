//! Triton's logging and trace extensions over gRPC (`LogSettings`,
//! `TraceSetting`), with the same keys and checks as over HTTP.

use nereid_proto::inference::*;
use tonic::Status;

use super::status::to_status;
use crate::parameter::Parameter;
use crate::server::InferenceServer;
use crate::trace::settings::Change as TraceChange;

pub fn log(server: &InferenceServer, request: LogSettingsRequest) -> Result<LogSettingsResponse, Status> {
    use log_settings_request::setting_value::ParameterChoice as In;
    use log_settings_response::setting_value::ParameterChoice as Out;
    let mut changes = Vec::new();
    for (key, value) in request.settings {
        let value = match value.parameter_choice {
            Some(In::BoolParam(b)) => Parameter::Bool(b),
            Some(In::Uint32Param(n)) => Parameter::Int(i64::from(n)),
            Some(In::StringParam(s)) => Parameter::String(s),
            None => return Err(Status::invalid_argument(format!("log setting '{key}' has no value"))),
        };
        changes.push((key, value));
    }
    let settings = if changes.is_empty() {
        server.log_settings()
    } else {
        server.update_log_settings(&changes).map_err(to_status)?
    };
    let value = |choice: Out| log_settings_response::SettingValue {
        parameter_choice: Some(choice),
    };
    let settings = [
        ("log_file", value(Out::StringParam(String::new()))),
        ("log_info", value(Out::BoolParam(settings.info))),
        ("log_warning", value(Out::BoolParam(settings.warning))),
        ("log_error", value(Out::BoolParam(settings.error))),
        ("log_verbose_level", value(Out::Uint32Param(settings.verbose_level))),
        (
            "log_format",
            value(Out::StringParam(settings.format.as_str().to_string())),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok(LogSettingsResponse { settings })
}

pub fn trace(server: &InferenceServer, r: TraceSettingRequest) -> Result<TraceSettingResponse, Status> {
    let model = (!r.model_name.is_empty()).then_some(r.model_name.as_str());
    // An empty value list clears a model's own setting, as in Triton.
    let changes: Vec<(String, TraceChange)> = r
        .settings
        .into_iter()
        .map(|(key, v)| {
            let change = if v.value.is_empty() {
                TraceChange::Clear
            } else {
                TraceChange::Set(v.value)
            };
            (key, change)
        })
        .collect();
    let e = if changes.is_empty() {
        server.trace_settings(model)
    } else {
        server.update_trace_settings(model, &changes)
    }
    .map_err(to_status)?;
    let value = |v: &str| trace_setting_response::SettingValue {
        value: vec![v.to_string()],
    };
    let settings = [
        ("trace_file", value("")),
        ("trace_level", value(e.level.as_str())),
        ("trace_rate", value(&e.rate.to_string())),
        ("trace_count", value(&e.count.to_string())),
        ("log_frequency", value(&e.log_frequency.to_string())),
        ("trace_mode", value("opentelemetry")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok(TraceSettingResponse { settings })
}
