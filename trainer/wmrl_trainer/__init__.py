"""The WMRL trainer: GRPO (TRL) with world-model rewards, real anchors and shared calibration."""
