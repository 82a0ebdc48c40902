# An MMEngine config (read by docs/examples/mmengine_config.py with Config.fromfile):
# the MMEngine recorder proposal's toy model, recorded with bcrecord's RecorderHook.
# The model and dataset types are registered by the script that runs this config.

custom_imports = dict(imports=["bcrecord.integrations.mmengine"], allow_failed_imports=False)

model = dict(type="BcrecordExampleToyModel")
train_dataloader = dict(
    dataset=dict(type="BcrecordExampleToyDataset", n=12),
    sampler=dict(type="DefaultSampler", shuffle=False),
    batch_size=3,
    num_workers=0,
)
train_cfg = dict(by_epoch=True, max_epochs=1)
optim_wrapper = dict(optimizer=dict(type="SGD", lr=0.1))
default_hooks = dict(checkpoint=None, logger=dict(type="LoggerHook", interval=1))
randomness = dict(seed=0)
work_dir = "./work_dirs/bcrecord_mmengine_example"

custom_hooks = [
    dict(
        type="RecorderHook",
        recorders=[
            # the proposal's two recorders: local `outputs` after its 2nd assignment,
            # and linear1's weight when forward starts
            dict(type="FunctionRecorder", target="outputs", index=[1]),
            dict(type="AttributeRecorder", target="self.linear1.weight"),
            # and what it takes to check `outputs` by hand
            dict(type="FunctionRecorder", target="inputs", index=[0]),  # the stacked batch
            dict(type="AttributeRecorder", target="self.linear1.bias"),
            dict(type="AttributeRecorder", target="self.linear2.weight"),
            dict(type="AttributeRecorder", target="self.linear2.bias"),
        ],
        save_dir="./work_dirs/bcrecord_mmengine_example/records",
    )
]
