"""The kernel contract: a target file and the spec beside it, found and checked statically (the
orchestrator never imports kernel code), or any file of a repository that brings its own harness."""
