"""Closed-loop evaluation in simulation: the benchmark interface and registry (`benchmark`), the subprocess pool of
simulators (`pool`), the episode loop (`rollout`), where actions come from (`actions`), the frames' preparation
(`images`), MuJoCo's render back-end (`render`), the report (`report`) and one evaluation end to end (`evaluation`);
one package per benchmark (`libero/`, `metaworld/`)."""
