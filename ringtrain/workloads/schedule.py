"""The learning rate of synchronous data parallelism over N workers (ring
mode, TF's collective mode): scaled by N (Goyal et al., 2017), reached by a
linear warm-up from the single-worker lr."""


def learning_rate_schedule(lr, size, steps_per_epoch, scale=True, warmup_epochs=1.0):
    """lr_at(step). scale=False keeps lr (--no-lr-scaling; Adasum, which
    combines gradients without growing their magnitude)."""
    target = lr * (size if scale else 1)
    warmup_steps = int(warmup_epochs * steps_per_epoch)

    def lr_at(step):
        if warmup_steps <= 0 or step >= warmup_steps:
            return target
        return lr + (target - lr) * step / warmup_steps

    return lr_at
