/**
 * The one job model, for the local runner, the server and the worker alike:
 * job and task states (model/states.ts), the events and their data
 * (model/events.ts), the `needs` rule of a job of tasks (model/needs.ts) and
 * the status document (model/status.ts). Pure: no store, no process.
 */
export { FINAL_STATES, isFinal, JOB_STATES, type JobState } from "./model/states.ts";
export { type EventSink, eventIs, isJobEventName, JOB_EVENT_NAMES, type JobEventData, type JobEventName, type JobEventOf, type OutputFile, PHASE_NAMES, PHASE_STATES, type PhaseName, type PrepareFinished, type RecordedEvent, type RelayMark } from "./model/events.ts";
export { jobEnd, type Readiness, readiness, unstartedEnds } from "./model/needs.ts";
export { endedPhases, type JobFacts, type JobStatus, outputsOfEvents, type Phase, phasesOf, statusDocument, type TaskStatus, taskStatus } from "./model/status.ts";
