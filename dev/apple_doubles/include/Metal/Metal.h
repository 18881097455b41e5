// Test double of Apple's Metal framework (macOS 13 SDK): the subset csrc/metal/*.mm and the
// tensorflow-metal double use, declared with the SDK's names and signatures and nothing Apple's headers lack.
// Implemented by dev/apple_doubles/src/metal.mm; conventions and the rules it asserts: dev/apple_doubles/README.md.
#pragma once
#import <Foundation/Foundation.h>

#define MTL_EXTERN extern "C" __attribute__((visibility("default")))
#define MTL_INLINE static inline

NS_ASSUME_NONNULL_BEGIN

// ---- MTLTypes.h -------------------------------------------------------------------------------------------
typedef struct {
  NSUInteger width, height, depth;
} MTLSize;

MTL_INLINE MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize size = {width, height, depth};
  return size;
}

// ---- MTLResource.h ----------------------------------------------------------------------------------------
typedef NS_ENUM(NSUInteger, MTLStorageMode) {
  MTLStorageModeShared = 0,
  MTLStorageModeManaged = 1,
  MTLStorageModePrivate = 2,
  MTLStorageModeMemoryless = 3,
};
#define MTLResourceStorageModeShift 4
#define MTLResourceStorageModeMask (0xfUL << MTLResourceStorageModeShift)
typedef NS_OPTIONS(NSUInteger, MTLResourceOptions) {
  MTLResourceCPUCacheModeDefaultCache = 0,
  MTLResourceStorageModeShared = MTLStorageModeShared << MTLResourceStorageModeShift,
  MTLResourceStorageModeManaged = MTLStorageModeManaged << MTLResourceStorageModeShift,
  MTLResourceStorageModePrivate = MTLStorageModePrivate << MTLResourceStorageModeShift,
};

@protocol MTLDevice;

@protocol MTLResource <NSObject>
@property (nullable, copy, atomic) NSString* label;
@property (readonly) id<MTLDevice> device;
@property (readonly) MTLStorageMode storageMode;
@end

// ---- MTLBuffer.h ------------------------------------------------------------------------------------------
@protocol MTLBuffer <MTLResource>
@property (readonly) NSUInteger length;
- (void*)contents NS_RETURNS_INNER_POINTER;
@end

// ---- MTLArgument.h ----------------------------------------------------------------------------------------
typedef NS_ENUM(NSUInteger, MTLDataType) {
  MTLDataTypeNone = 0,
  MTLDataTypeFloat = 3,
  MTLDataTypeInt = 29,
  MTLDataTypeUInt = 33,
  MTLDataTypeBool = 53,
};

// ---- MTLFunctionConstantValues.h --------------------------------------------------------------------------
@interface MTLFunctionConstantValues : NSObject <NSCopying>
- (void)setConstantValue:(const void*)value type:(MTLDataType)type atIndex:(NSUInteger)index;
- (void)reset;
@end

// ---- MTLLibrary.h -----------------------------------------------------------------------------------------
typedef NS_ENUM(NSUInteger, MTLLanguageVersion) {
  MTLLanguageVersion2_4 = (2 << 16) + 4,
  MTLLanguageVersion3_0 = (3 << 16) + 0,
};

typedef NS_ENUM(NSUInteger, MTLLibraryError) {
  MTLLibraryErrorUnsupported = 1,
  MTLLibraryErrorInternal = 2,
  MTLLibraryErrorCompileFailure = 3,
  MTLLibraryErrorCompileWarning = 4,
  MTLLibraryErrorFunctionNotFound = 5,
  MTLLibraryErrorFileNotFound = 6,
};
MTL_EXTERN NSErrorDomain const MTLLibraryErrorDomain;

@interface MTLCompileOptions : NSObject <NSCopying>
@property (nullable, readwrite, copy, nonatomic) NSDictionary<NSString*, NSObject*>* preprocessorMacros;
@property (readwrite, nonatomic) BOOL fastMathEnabled;
@property (readwrite, nonatomic) MTLLanguageVersion languageVersion;
@end

@protocol MTLFunction <NSObject>
@property (nullable, copy, atomic) NSString* label;
@property (readonly) id<MTLDevice> device;
@property (readonly) NSString* name;
@end

@protocol MTLLibrary <NSObject>
@property (nullable, copy, atomic) NSString* label;
@property (readonly) id<MTLDevice> device;
- (nullable id<MTLFunction>)newFunctionWithName:(NSString*)functionName;
- (nullable id<MTLFunction>)newFunctionWithName:(NSString*)name
                                 constantValues:(MTLFunctionConstantValues*)constantValues
                                          error:(__autoreleasing NSError**)error;
@property (readonly) NSArray<NSString*>* functionNames;
@end

// ---- MTLComputePipeline.h ---------------------------------------------------------------------------------
@protocol MTLComputePipelineState <NSObject>
@property (nullable, readonly) NSString* label;
@property (readonly) id<MTLDevice> device;
@property (readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property (readonly) NSUInteger threadExecutionWidth;
@property (readonly) NSUInteger staticThreadgroupMemoryLength;
@end

// ---- MTLCommandEncoder.h / MTLComputeCommandEncoder.h / MTLBlitCommandEncoder.h ---------------------------
@protocol MTLCommandEncoder <NSObject>
@property (readonly) id<MTLDevice> device;
@property (nullable, copy, atomic) NSString* label;
- (void)endEncoding;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setBuffer:(nullable id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

@protocol MTLBlitCommandEncoder <MTLCommandEncoder>
- (void)copyFromBuffer:(id<MTLBuffer>)sourceBuffer
          sourceOffset:(NSUInteger)sourceOffset
              toBuffer:(id<MTLBuffer>)destinationBuffer
     destinationOffset:(NSUInteger)destinationOffset
                  size:(NSUInteger)size;
@end

// ---- MTLCommandBuffer.h / MTLCommandQueue.h ---------------------------------------------------------------
typedef NS_ENUM(NSUInteger, MTLCommandBufferStatus) {
  MTLCommandBufferStatusNotEnqueued = 0,
  MTLCommandBufferStatusEnqueued = 1,
  MTLCommandBufferStatusCommitted = 2,
  MTLCommandBufferStatusScheduled = 3,
  MTLCommandBufferStatusCompleted = 4,
  MTLCommandBufferStatusError = 5,
};

MTL_EXTERN NSErrorDomain const MTLCommandBufferErrorDomain;
typedef NS_ENUM(NSUInteger, MTLCommandBufferError) {
  MTLCommandBufferErrorNone = 0,
  MTLCommandBufferErrorInternal = 1,
  MTLCommandBufferErrorTimeout = 2,
  MTLCommandBufferErrorPageFault = 3,
  MTLCommandBufferErrorNotPermitted = 7,
  MTLCommandBufferErrorOutOfMemory = 8,
  MTLCommandBufferErrorInvalidResource = 9,
};

@protocol MTLCommandBuffer;
@protocol MTLCommandQueue;
typedef void (^MTLCommandBufferHandler)(id<MTLCommandBuffer>);

@protocol MTLCommandBuffer <NSObject>
@property (readonly) id<MTLDevice> device;
@property (readonly) id<MTLCommandQueue> commandQueue;
@property (nullable, copy, atomic) NSString* label;
- (void)enqueue;
- (void)commit;
- (void)addScheduledHandler:(MTLCommandBufferHandler)block;
- (void)addCompletedHandler:(MTLCommandBufferHandler)block;
- (void)waitUntilScheduled;
- (void)waitUntilCompleted;
@property (readonly) MTLCommandBufferStatus status;
@property (nullable, readonly) NSError* error;
- (nullable id<MTLBlitCommandEncoder>)blitCommandEncoder;
- (nullable id<MTLComputeCommandEncoder>)computeCommandEncoder;
@end

@protocol MTLCommandQueue <NSObject>
@property (nullable, copy, atomic) NSString* label;
@property (readonly) id<MTLDevice> device;
- (nullable id<MTLCommandBuffer>)commandBuffer;
@end

// ---- MTLDevice.h ------------------------------------------------------------------------------------------
typedef NS_ENUM(NSInteger, MTLGPUFamily) {
  MTLGPUFamilyApple7 = 1007,
  MTLGPUFamilyApple8 = 1008,
  MTLGPUFamilyMac2 = 2002,
  MTLGPUFamilyCommon3 = 3003,
  MTLGPUFamilyMetal3 = 5001,
};

@protocol MTLDevice <NSObject>
@property (readonly) NSString* name;
@property (readonly) uint64_t registryID;
@property (readonly, getter=isLowPower) BOOL lowPower;
@property (readonly) BOOL hasUnifiedMemory;
@property (readonly) NSUInteger maxThreadgroupMemoryLength;
@property (readonly) NSUInteger maxBufferLength;
- (nullable id<MTLCommandQueue>)newCommandQueue;
- (nullable id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (nullable id<MTLLibrary>)newLibraryWithURL:(NSURL*)url error:(__autoreleasing NSError**)error;
- (nullable id<MTLLibrary>)newLibraryWithSource:(NSString*)source
                                        options:(nullable MTLCompileOptions*)options
                                          error:(__autoreleasing NSError**)error;
- (nullable id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                                      error:(__autoreleasing NSError**)error;
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily;
@end

MTL_EXTERN id<MTLDevice> __nullable MTLCreateSystemDefaultDevice(void) NS_RETURNS_RETAINED;
MTL_EXTERN NSArray<id<MTLDevice>>* MTLCopyAllDevices(void) NS_RETURNS_RETAINED;

NS_ASSUME_NONNULL_END
