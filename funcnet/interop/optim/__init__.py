"""Optimizers: a torch optimizer and its lr scheduler as one optax transformation.

``convert`` reads torch's param groups onto the params tree (``convert_optimizer``); ``rules``
holds each torch.optim update rule as optax transforms; ``schedules`` each
``torch.optim.lr_scheduler`` in closed form.
"""
