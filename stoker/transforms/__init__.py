"""Reading the user's transform: which op each step is (kinds.py: torchvision's classes, their
subclasses, timm's), where each step runs (torchvision_plan.py: fused into the decode, on the
batch, or per sample) and the batched form of the steps that run on a batch (batched_ops.py,
stoker.augment's ops). The Loader's plan asks it; so does the doctor's probe of a packed set."""
