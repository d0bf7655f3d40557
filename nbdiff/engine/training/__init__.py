"""What training changes between two steps, compared: the optimizers' updates
(:mod:`~nbdiff.engine.training.updates`), a learning rate apart where the gradients are too
(:mod:`~nbdiff.engine.training.step_size`), weights drifting apart through agreeing updates
(:mod:`~nbdiff.engine.training.drift`), parameters written outside the optimizer
(:mod:`~nbdiff.engine.training.outside`) and running statistics
(:mod:`~nbdiff.engine.training.state`). Part of the engine's shared comparison: live and recorded
steps both read it, and it reads neither."""
